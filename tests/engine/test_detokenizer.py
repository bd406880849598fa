"""Incremental detokenization: characters split across tokens, stop strings split across
tokens, and the text held back while a stop string might still be forming."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer


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
