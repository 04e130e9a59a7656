"""`fleetctl simulate`: production traces driven through the control plane on a virtual clock.

The simulator is a driver, not a policy. Every control decision (admission, release, replica
placement and readiness, autoscaler ticks, rollout evidence and stages) is a command accepted
into the log and decided by `controlplane.service.decide`; the data plane (engines batching
tokens, prefill, prefix caches) is the simulated world those decisions act on.

Modules: `traces` (readers), `costs` and `dataplane` (engines), `routing`, `control` (the path
to the log), `fleet`, `autoscaler` (its observations and cadence), `canary`, `run`
(the loop), `sampling`, `report` and `chart`.
"""
