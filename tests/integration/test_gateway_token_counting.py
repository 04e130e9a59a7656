"""A profile's input-token counting rule bounds what a request's text can make it cost.

The spec's stand-in counts whitespace-separated words, so a long input without spaces counts
as one token; a profile registered with `token_counting: utf8_bytes` counts a token per byte,
an upper bound for byte-level tokenizers, which the input limit, the context window and the
budget grant are all checked against. Every test ends with the fixture's replay check.
"""

from __future__ import annotations

from controlplane.commands.gateway import RegisterProfile
from controlplane.gateway.scenario import GatewayDriver, dispatch
from controlplane.state import gateway as gw

NO_SPACES = "x" * 9_000  # one whitespace word, 9,000 bytes: above chat-small-v1's 8,191 limit


def count_bytes(gateway: GatewayDriver) -> None:
    """chat-small-v1 as the fixture registers it, but counting UTF-8 bytes."""
    gateway.run(RegisterProfile(
        profile_id="chat-small-v1", model_id="small-8b", digest="sha256:small", approved=True,
        context_window_tokens=8_192, max_output_tokens=1_024, capabilities=["text"],
        approved_providers=["hostedco", "selfhost"], token_counting="utf8_bytes",
        memory=gateway_memory(gateway)))


def gateway_memory(gateway: GatewayDriver) -> dict[str, object]:
    profile = gateway.projection(gw.REGISTRIES["profile"], "chat-small-v1")
    assert profile is not None
    return profile["memory"]


def test_a_profile_counting_bytes_refuses_a_long_input_without_spaces(
        gateway: GatewayDriver) -> None:
    count_bytes(gateway)
    budget = gateway.budget()
    response = gateway.send(dispatch("alice", "k-long", text=NO_SPACES))
    assert (response["outcome"], response["code"]) == ("denied", "input_too_large")
    [denied] = [e for e in gateway.store.read_stream(gw.operation_stream("acme", "k-long"))
                if e.event_type == gw.DISPATCH_DENIED]
    assert denied.data["reasons"][0]["facts"] == {
        "input_tokens": 9_000, "limit_tokens": 8_191, "token_counting": "utf8_bytes"}
    assert gateway.calls() == 0 and gateway.budget() == budget


def test_the_grant_of_a_profile_counting_bytes_covers_every_byte(gateway: GatewayDriver) -> None:
    count_bytes(gateway)
    text = "é" * 1_000  # 1,000 characters, one word, 2,000 bytes in UTF-8
    response = gateway.send(dispatch("alice", "k-accents", text=text, max_output_tokens=256))
    assert response["outcome"] == "completed"
    operation = gateway.operation("acme", "k-accents")
    assert operation is not None
    assert (operation["input_tokens"], operation["grant_units"]) == (2_000, 2_256)


def test_a_profile_by_default_counts_whitespace_words_and_records_no_rule(
        gateway: GatewayDriver) -> None:
    """The spec's stand-in, as the reference figures need it: the same input is one token."""
    response = gateway.send(dispatch("alice", "k-long", text=NO_SPACES, max_output_tokens=256))
    assert response["outcome"] == "completed"
    operation = gateway.operation("acme", "k-long")
    assert operation is not None
    assert (operation["input_tokens"], operation["grant_units"]) == (1, 257)
    profile = gateway.projection(gw.REGISTRIES["profile"], "chat-small-v1")
    assert profile is not None and "token_counting" not in profile
    registered = RegisterProfile(profile_id="p", model_id="m", digest="sha256:p", approved=True,
                                 context_window_tokens=10, max_output_tokens=5)
    assert "token_counting" not in registered.payload()
    assert registered.model_copy(update={"token_counting": "utf8_bytes"}).payload()[
        "token_counting"] == "utf8_bytes"


def test_a_context_window_refusal_under_a_byte_count_names_the_rule(
        gateway: GatewayDriver) -> None:
    count_bytes(gateway)
    response = gateway.send(dispatch("alice", "k-window", text="y" * 8_000,
                                     max_output_tokens=1_024))
    assert (response["outcome"], response["code"]) == ("denied", "context_window_exceeded")
    [denied] = [e for e in gateway.store.read_stream(gw.operation_stream("acme", "k-window"))
                if e.event_type == gw.DISPATCH_DENIED]
    assert denied.data["reasons"][0]["facts"] == {
        "total_tokens": 9_024, "context_window_tokens": 8_192, "token_counting": "utf8_bytes"}
