"""The API process's side of an engine core process's outputs (engine/text_outputs.py), driven
with the token-only outputs a core sends, made up here, so that the races between a stop
string found here and the core's own end of the sample happen every time:

- the stop string completes on the token the core ends the sample with (its max_tokens-th):
  one last output, reason stop, the text cut before the stop string, and nothing sent back;
- the core ends the sample (by length, or as told, or by an abort) before it has read the
  EndSample sent after the stop string: what it sends for the sample is dropped, so the
  client gets one last output, counted once;
- the same with two samples, the other one going on; the core's death after a stop string;
- a Report that comes back before add_request has returned (the core answered at once)."""

from __future__ import annotations

import threading
import time
from collections import deque

import msgspec
import pytest

from engine.config import EngineConfig
from engine.process.client import EngineProcessClient
from engine.process.messages import AddRequest, CoreState, Rates
from engine.request import FinishReason, Request, RequestOutput, SamplingParams
from engine.text_outputs import TextOutputs

STOP = "STOPWORD"  # the tiny model's tokenizer splits it over tokens (test_detokenizer.py)
TEXT = " one two three STOPWORD four five six"
BEFORE = " one two three "  # the text before the stop string


class Client:
    """What one request's client receives, and what is sent back to the core."""

    def __init__(self, tokenizer) -> None:
        self.received: list[RequestOutput] = []
        self.ended: list[str] = []  # EndSample's sample ids
        self.texts = TextOutputs(tokenizer, self.ended.append)

    def add(self, prompt: list[int], n: int = 1, max_tokens: int = 32) -> None:
        params = SamplingParams(max_tokens=max_tokens, stop=[STOP], n=n, temperature=1.0)
        self.texts.add(Request("r", prompt, params, on_output=self.received.append))

    def finished(self, index: int = 0) -> list[RequestOutput]:
        return [o for o in self.received if o.finished and o.sample_index == index]

    def text(self, index: int = 0) -> str:
        return "".join(o.text for o in self.received if o.sample_index == index)

    def finishes(self) -> dict[str, float]:
        registry = self.texts.finishes.registry
        return {reason: registry.get_sample_value("nano_vllm:request_success_total",
                                                  {"finished_reason": reason}) or 0
                for reason in ("stop", "length", "abort", "error")}


def core_output(index: int, token: int | None, count: int,
                reason: FinishReason | None = None) -> RequestOutput:
    """The core's output for sample `index` of request "r": one new token (or none), text
    empty, `count` tokens out so far."""
    sample_id = "r" + (f"#{index}" if index else "")
    return RequestOutput(sample_id, "", [] if token is None else [token],
                         finished=reason is not None, finish_reason=reason,
                         num_output_tokens=count, sample_index=index)


@pytest.fixture(scope="module")
def story(tokenizer) -> tuple[list[int], list[int], int]:
    """The prompt, the output's tokens, and how many of them end with the one that completes
    the stop string."""
    prompt = tokenizer("Count:").input_ids
    tokens = tokenizer(TEXT, add_special_tokens=False).input_ids
    kept = next(k for k in range(1, len(tokens) + 1)
                if STOP in tokenizer.decode(tokens[:k]))
    print(f"tokens {[tokenizer.decode([t]) for t in tokens]}; {STOP!r} completes at {kept}")
    assert tokenizer.decode(tokens[kept - 1:kept]) != STOP  # completed across tokens
    assert kept < len(tokens) - 1
    return prompt, tokens, kept


def stream(client: Client, tokens: list[int], upto: int, last: FinishReason | None = None,
           index: int = 0) -> None:
    """The core's outputs for one sample, a token a step, the last one ending it by `last`."""
    for i, token in enumerate(tokens[:upto]):
        end = last if i == upto - 1 else None
        client.texts.deliver([("r", core_output(index, token, i + 1, end))])


def test_a_stop_string_completed_by_the_core_s_last_token_ends_it_once_as_stop(tokenizer,
                                                                              story):
    """max_tokens = the token that completes the stop string: the core ends the sample by
    length in the very output in which the stop string is found here."""
    prompt, tokens, kept = story
    client = Client(tokenizer)
    client.add(prompt, max_tokens=kept)
    stream(client, tokens, kept, last=FinishReason.LENGTH)
    [last] = client.finished()
    print(f"text {client.text()!r}; last output {last}")
    assert client.text() == BEFORE
    assert last.finish_reason is FinishReason.STOP and last.stop_string == STOP
    assert last.num_output_tokens == kept and last.token_ids == tokens[kept - 1:kept]
    assert client.ended == []  # the core has ended it already
    assert client.finishes() == {"stop": 1, "length": 0, "abort": 0, "error": 0}
    assert "r" not in client.texts and client.texts.num_samples == 0


@pytest.mark.parametrize("core_end", ["length", "told", "abort"])
def test_the_core_s_own_end_after_a_stop_string_is_dropped(tokenizer, story, core_end):
    """The stop string completes one token before max_tokens: the sample ends here and the
    core is told. The core's next Report ends it too, by length (the step it had begun
    before reading EndSample), as told (reason stop, no token), or by an abort the client
    sent meanwhile: the client sees none of it."""
    prompt, tokens, kept = story
    client = Client(tokenizer)
    client.add(prompt, max_tokens=kept + 1)
    stream(client, tokens, kept)
    assert client.ended == ["r"]
    received = list(client.received)
    late = {"length": core_output(0, tokens[kept], kept + 1, FinishReason.LENGTH),
            "told": core_output(0, None, kept, FinishReason.STOP),
            "abort": core_output(0, None, kept, FinishReason.ABORT)}[core_end]
    client.texts.deliver([("r", late)])
    print(f"text {client.text()!r}; the core's end {late.finish_reason} dropped")
    assert client.received == received
    [last] = client.finished()
    assert last.finish_reason is FinishReason.STOP and client.text() == BEFORE
    assert last.num_output_tokens == kept
    assert client.ended == ["r"]  # told once
    assert client.finishes() == {"stop": 1, "length": 0, "abort": 0, "error": 0}
    assert "r" not in client.texts and client.texts.num_samples == 0


def test_a_sample_ended_here_drops_out_while_the_other_goes_on(tokenizer, story):
    """n=2: sample 1 reaches the stop string; the core's next Report has sample 0's next
    token and sample 1's end by length. Sample 0 goes on to its own end."""
    prompt, tokens, kept = story
    other = tokenizer(" alpha beta gamma delta epsilon zeta eta theta",
                      add_special_tokens=False).input_ids[:kept + 2]
    client = Client(tokenizer)
    client.add(prompt, n=2, max_tokens=kept + 2)
    for i in range(kept):
        client.texts.deliver([("r", core_output(0, other[i], i + 1)),
                                  ("r", core_output(1, tokens[i], i + 1))])
    assert client.ended == ["r#1"] and client.texts.num_samples == 1
    client.texts.deliver([("r", core_output(0, other[kept], kept + 1)),
                              ("r", core_output(1, tokens[kept], kept + 1,
                                                FinishReason.LENGTH))])
    assert "r" in client.texts and client.texts.num_samples == 1
    client.texts.deliver([("r", core_output(0, other[kept + 1], kept + 2,
                                                FinishReason.LENGTH))])
    print(f"texts {client.text(0)!r}, {client.text(1)!r}")
    assert [o.finish_reason for o in client.finished(1)] == [FinishReason.STOP]
    assert [o.finish_reason for o in client.finished(0)] == [FinishReason.LENGTH]
    assert client.text(1) == BEFORE and client.text(0) == tokenizer.decode(other)
    assert client.finishes() == {"stop": 1, "length": 1, "abort": 0, "error": 0}
    assert "r" not in client.texts and client.texts.num_samples == 0


def test_the_core_s_death_fails_only_the_samples_still_running(tokenizer, story):
    prompt, tokens, kept = story
    client = Client(tokenizer)
    client.add(prompt, n=2)
    for i in range(kept):
        client.texts.deliver([("r", core_output(1, tokens[i], i + 1))])
    client.texts.fail_all("the core died")
    client.texts.deliver([("r", core_output(0, tokens[0], 1))])  # a late one: dropped
    assert [o.finish_reason for o in client.finished(1)] == [FinishReason.STOP]
    [failed] = client.finished(0)
    assert failed.error == "the core died" and failed.text == "" and failed.request_id == "r"
    assert client.finishes() == {"stop": 1, "length": 0, "abort": 0, "error": 1}
    assert client.texts.num_samples == 0


class AnsweringSocket:
    """The requests socket of a client whose core answers before add_request has returned:
    the Report (the request's one token, the end by length) is delivered at once."""

    closed = False

    def __init__(self, client: EngineProcessClient) -> None:
        self.client = client
        self.decoder = msgspec.msgpack.Decoder(AddRequest)

    def send(self, raw: bytes, flags: int = 0) -> None:
        request_id = self.decoder.decode(raw).request_id
        output = RequestOutput(request_id, "", [9], finished=True,
                               finish_reason=FinishReason.LENGTH, num_output_tokens=1)
        self.client.texts.deliver([(request_id, output)])


def processless_client(tokenizer) -> EngineProcessClient:
    """A client with its admission and send, and no core process or sockets."""
    client = EngineProcessClient.__new__(EngineProcessClient)
    client.config = EngineConfig()
    client.texts = TextOutputs(tokenizer, lambda sample_id: None)
    stats = {"running": 0, "waiting": 0, "blocks_total": 0, "blocks_used": 0,
             "blocks_free": 0, "blocks_cached_free": 0}
    client._state = CoreState(stats, 0, 0, Rates())  # type: ignore[arg-type]
    client._lock, client._unavailable, client._failure = threading.Lock(), None, None
    client._unacked, client._seq = deque(), 0
    client._encoder = msgspec.msgpack.Encoder()
    return client


def test_a_report_that_comes_back_at_once_reaches_its_request(tokenizer):
    """No process: the client's admission and send, with a socket that answers at once."""
    client = processless_client(tokenizer)
    client._requests = AnsweringSocket(client)  # type: ignore[assignment]
    received: list[RequestOutput] = []
    client.add_request(Request("r", tokenizer("Hi").input_ids, SamplingParams(max_tokens=1),
                               on_output=received.append))
    print("received:", received)
    assert [(o.token_ids, o.finish_reason) for o in received] == [([9], FinishReason.LENGTH)]
    assert client.num_in_flight == 0 and "r" not in client.texts


def test_a_request_sent_as_the_core_dies_is_refused_at_once(tokenizer):
    """A core that has just exited has no peer on the requests socket, where zmq's send
    would wait for one on the event loop's thread: the request is refused instead (503),
    untracked, and nothing waits."""
    import zmq

    from engine.admission import EngineUnavailableError

    client = processless_client(tokenizer)
    context = zmq.Context()
    client._requests = context.socket(zmq.PUSH)  # bound, no peer: the core is gone
    client._requests.bind("inproc://nobody")
    client._process = type("Exited", (), {"poll": lambda self: -9})()  # type: ignore[assignment]
    started = time.monotonic()
    with pytest.raises(EngineUnavailableError, match="exited"):
        client.add_request(Request("r", tokenizer("Hi").input_ids,
                                   SamplingParams(max_tokens=1), on_output=print))
    assert time.monotonic() - started < 1 and "r" not in client.texts
    client._requests.close(linger=0)
    context.term()
