"""The inference gateway's outside world: adapters, fault injection, execution of a dispatch,
responses and explanations. The decisions themselves live in `policies/gateway*.py`."""
