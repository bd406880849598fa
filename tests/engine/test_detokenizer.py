"""Incremental detokenization: characters split across tokens, stop strings split across
tokens, and the text held back while a stop string might still be forming; and a sample's
text made from the core's token-only outputs (SampleText, as the API process makes it for a
core in its own process): a stop string split across outputs, or found among several tokens
of one output, cuts the tokens and logprobs after it."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer, SampleText
from engine.logprobs import TokenLogprobs
from engine.request import FinishReason, RequestOutput


def feed(tokenizer, prompt: list[int], output: list[int],
         stop: list[str]) -> tuple[list[str], IncrementalDetokenizer]:
    """Add output tokens one at a time; the text handed out after each."""
    detok = IncrementalDetokenizer(tokenizer, prompt, stop)
    ids, deltas = list(prompt), []
    for token in output:
        ids.append(token)
        detok.add(ids)
        deltas.append(detok.take(final=False))
        if detok.stopped:
            break
    deltas.append(detok.take(final=True))
    return deltas, detok


def test_a_character_split_over_tokens_is_released_whole(tokenizer):
    prompt = tokenizer("Say:").input_ids
    text = " café 日本語 🙂 done"
    output = tokenizer(text, add_special_tokens=False).input_ids
    split = [t for t in output if "\ufffd" in tokenizer.decode([t])]
    print(f"{len(output)} tokens, {len(split)} of them partial characters on their own")
    assert split, "the text must contain characters split across tokens"
    deltas, _ = feed(tokenizer, prompt, output, [])
    print("deltas:", deltas)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_a_stop_string_split_over_tokens_ends_the_text_before_it(tokenizer):
    prompt = tokenizer("Count:").input_ids
    output = tokenizer(" one two three STOPWORD four", add_special_tokens=False).input_ids
    stop_tokens = [tokenizer.decode([t]) for t in output]
    print("tokens:", stop_tokens)
    assert "STOPWORD" not in stop_tokens and " STOPWORD" not in stop_tokens  # really split
    deltas, detok = feed(tokenizer, prompt, output, ["STOPWORD"])
    print("deltas:", deltas)
    assert detok.stopped and detok.matched_stop == "STOPWORD"
    assert "".join(deltas) == " one two three "
    # Nothing that could begin the stop string was handed out before the end.
    assert "S" not in "".join(deltas[:-1])


def test_text_is_held_back_only_as_long_as_the_longest_stop_string(tokenizer):
    prompt = tokenizer("Go:").input_ids
    output = tokenizer(" alpha beta gamma", add_special_tokens=False).input_ids
    deltas, detok = feed(tokenizer, prompt, output, ["xyz!"])
    print("deltas:", deltas)
    assert not detok.stopped
    assert "".join(deltas) == " alpha beta gamma"
    assert len(deltas[-1]) <= len("xyz!") - 1  # all but the last 3 characters came earlier


def test_the_stop_string_that_appears_first_is_the_one_matched(tokenizer):
    prompt = tokenizer("Go:").input_ids
    output = tokenizer(" red green blue", add_special_tokens=False).input_ids
    deltas, detok = feed(tokenizer, prompt, output, ["blue", "green"])
    print("deltas:", deltas, "matched:", detok.matched_stop)
    assert detok.matched_stop == "green"  # listed second, but it comes first in the text
    assert "".join(deltas) == " red "
    _, unstopped = feed(tokenizer, prompt, output, ["xyz"])
    assert unstopped.matched_stop is None


def core_output(tokens: list[int], num_output_tokens: int, finish: FinishReason | None = None,
                logprobs: bool = False) -> RequestOutput:
    """What the engine core sends: token ids, counts, no text."""
    output = RequestOutput("r", "", list(tokens), finished=finish is not None,
                           finish_reason=finish, num_output_tokens=num_output_tokens)
    if logprobs:
        output.logprobs = [TokenLogprobs(t, -0.5, []) for t in tokens]
    return output


def stop_case(tokenizer) -> tuple[list[int], list[int], int]:
    """A prompt, output tokens with "STOPWORD" over several of them, and how many of them
    make up the text up to and including the stop string."""
    prompt = tokenizer("Count:").input_ids
    before = tokenizer(" one two three", add_special_tokens=False).input_ids
    output = tokenizer(" one two three STOPWORD four five", add_special_tokens=False).input_ids
    assert output[:len(before)] == before
    for cut in range(len(before), len(output) + 1):
        if "STOPWORD" in tokenizer.decode(output[:cut]):
            return prompt, output, cut
    raise AssertionError("no stop string in the text")


def test_a_stop_string_among_several_tokens_of_one_output_cuts_them(tokenizer):
    """As with speculative decoding: one output brings the whole stop string and tokens past
    it; they are dropped, with their logprobs, and the count follows."""
    prompt, output, cut = stop_case(tokenizer)
    text = SampleText(tokenizer, prompt, ["STOPWORD"])
    first = core_output(output[:2], 2, logprobs=True)
    assert not text.apply(first) and not first.finished
    rest = core_output(output[2:], len(output), logprobs=True)
    print("kept", cut, "of", len(output), "tokens:", tokenizer.decode(output[:cut]))
    assert text.apply(rest), "a sample the core has not ended: the caller must end it"
    assert rest.finished and rest.finish_reason is FinishReason.STOP
    assert rest.stop_string == "STOPWORD"
    assert rest.token_ids == output[2:cut] and rest.num_output_tokens == cut
    assert [e.token_id for e in rest.logprobs] == output[2:cut]
    assert rest.cumulative_logprob == -0.5 * cut  # of the tokens kept only
    assert first.text + rest.text == " one two three "


def test_a_stop_string_split_across_outputs_ends_at_the_token_that_completes_it(tokenizer):
    prompt, output, cut = stop_case(tokenizer)
    text = SampleText(tokenizer, prompt, ["STOPWORD"])
    outputs = []
    for i, token in enumerate(output):
        outputs.append(core_output([token], i + 1))
        if text.apply(outputs[-1]):
            break
    texts = [o.text for o in outputs]
    print("texts:", texts)
    assert len(outputs) == cut and outputs[-1].finished and not outputs[-2].finished
    assert outputs[-1].num_output_tokens == cut and outputs[-1].stop_string == "STOPWORD"
    assert "".join(texts) == " one two three " and "S" not in "".join(texts[:-1])


def test_a_stop_string_in_the_cores_last_output_makes_the_reason_stop(tokenizer):
    """The core ended the sample by length in the output that completes the stop string: the
    reason becomes stop, and there is nothing for the caller to end."""
    prompt, output, cut = stop_case(tokenizer)
    text = SampleText(tokenizer, prompt, ["STOPWORD"])
    last = core_output(output[:cut], cut, FinishReason.LENGTH)
    assert not text.apply(last)
    assert last.finish_reason is FinishReason.STOP and last.text == " one two three "


def test_a_stop_tokens_text_is_not_part_of_the_output(tokenizer):
    prompt = tokenizer("Go:").input_ids
    words = tokenizer(" red green", add_special_tokens=False).input_ids
    eos = tokenizer.eos_token_id
    text = SampleText(tokenizer, prompt, [])
    last = core_output([*words, eos], len(words) + 1, FinishReason.STOP)
    assert not text.apply(last)
    assert last.text == " red green" and last.token_ids == [*words, eos]
    assert last.stop_string is None


def test_min_tokens_holds_a_stop_string_off(tokenizer):
    """A stop string counts only once more than min_tokens tokens are out: with min_tokens
    at the whole output, the text runs on."""
    prompt, output, _ = stop_case(tokenizer)
    text = SampleText(tokenizer, prompt, ["STOPWORD"], min_tokens=len(output))
    last = core_output(output, len(output), FinishReason.LENGTH)
    assert not text.apply(last)
    assert last.finish_reason is FinishReason.LENGTH and "STOPWORD four" in last.text


class PythonOnly:
    """The same tokenizer seen without its Rust backend: the detokenizer's Python path."""

    def __init__(self, tokenizer) -> None:
        self.decode = tokenizer.decode


MIXED = [" café 日本語 🙂 done", "\n\nA list:\n- one\n- two\n\tTabbed  twice  spaced.",
         " 👩‍👩‍👧 ∑ x² — «quoted» 𝒜𝒷𝒸", " def f(x):\n    return {'a': [1, 2]}\n"]


def test_the_rust_stream_and_the_python_path_give_the_same_text(tokenizer):
    from engine.detokenizer import rust_tokenizer

    assert rust_tokenizer(tokenizer) is not None, "the default tokenizer takes the Rust stream"
    assert rust_tokenizer(PythonOnly(tokenizer)) is None
    special = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    prompt = tokenizer("Write:").input_ids
    for text in MIXED:
        output = tokenizer(text, add_special_tokens=False).input_ids
        output = [*output[:3], special, *output[3:]]  # a special token mid-stream is skipped
        fast, _ = feed(tokenizer, prompt, output, [])
        slow, _ = feed(PythonOnly(tokenizer), prompt, output, [])
        print(repr(text), fast)
        assert fast == slow, "same deltas after every token"
        assert "".join(fast) == tokenizer.decode(output, skip_special_tokens=True)
        assert "".join(fast) == text


def test_several_tokens_at_once_go_to_the_stream_together(tokenizer):
    prompt = tokenizer("Say:").input_ids
    output = tokenizer(MIXED[0], add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer, prompt, [])
    ids = list(prompt)
    for at in range(0, len(output), 3):  # three new tokens per call, as after a verify step
        ids += output[at:at + 3]
        detok.add(ids)
    assert detok.take(final=True) == MIXED[0]
    assert detok._stream is not None, "the Rust stream took them, not the Python path"


class Refusing:
    """A DecodeStream that fails on its n-th step."""

    def __init__(self, stream, fail_at: int) -> None:
        self.stream, self.fail_at, self.steps = stream, fail_at, 0

    def step(self, tokenizer, ids):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("invalid prefix")
        return self.stream.step(tokenizer, ids)


def test_a_failing_stream_hands_over_to_the_python_path_mid_text(tokenizer, caplog):
    prompt = tokenizer("Write:").input_ids
    output = tokenizer(MIXED[0] + MIXED[2], add_special_tokens=False).input_ids
    expected, _ = feed(PythonOnly(tokenizer), prompt, output, [])
    for fail_at in (1, 4, 7, len(output)):  # the first step, two mid-text, the last
        detok = IncrementalDetokenizer(tokenizer, prompt, [])
        detok._stream = Refusing(detok._stream, fail_at)
        ids, deltas = list(prompt), []
        for token in output:
            ids.append(token)
            detok.add(ids)
            deltas.append(detok.take(final=False))
        deltas.append(detok.take(final=True))
        assert detok._stream is None and "tokenizers stream failed" in caplog.text
        assert deltas == expected, f"failing at step {fail_at}"
