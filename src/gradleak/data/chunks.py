"""Fixed-length token chunks: a causal-LM dataset as Wu et al. 2023 train their victim on it.

Their data code (Hugging Face's ``group_texts``) tokenizes every line of the split, concatenates
the token lists in order, cuts the stream into consecutive blocks of exactly N tokens (16 in
their paper) and drops the remainder. A block starts and ends wherever the cut falls, mid-word
or mid-sentence, and carries no BOS or EOS: the sample is exactly N tokens, and the loss
predicts tokens 2..N from their prefixes.

A chunk is an :class:`Example` that carries its token ids. Its text alone could not stand for
it: decoding a cut of byte-level BPE and tokenizing the text again need not give the same ids
back (a cut inside a multi-byte character, or a merge across the cut that the stream did not
make), so the client would train on other tokens than the chunk's. With the ids in the
example, ``encode_examples`` uses them as they are, and the batch is exactly the chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gradleak.data.examples import Example
from gradleak.errors import GradleakError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CHUNK_TASK = "causal_lm"


def require_chunkable(task: str) -> None:
    """Chunks are next-token samples: any other task is a one-line error."""
    if task != CHUNK_TASK:
        raise GradleakError(
            f"--chunk-tokens cuts the data into next-token samples, and task {task} needs "
            "whole examples: use --task causal_lm (with a decoder) or drop --chunk-tokens"
        )


def token_stream(examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The examples' texts as one document, in order: each line tokenized with the newline that
    ends it in a file and without special tokens, the lists concatenated (Wu et al.'s code
    tokenizes each raw line, its newline included, and concatenates the same way)."""
    lines = [example.text + "\n" for example in examples]
    rows = tokenizer(lines, add_special_tokens=False, verbose=False)["input_ids"]
    return [token for row in rows for token in row]


def chunk_examples(
    examples: Sequence[Example],
    tokenizer: PreTrainedTokenizerBase,
    size: int,
    source: str = "the dataset",
) -> list[Example]:
    """The consecutive ``size``-token chunks of the examples' token stream (``token_stream``),
    the remainder dropped, each an :class:`Example` with its ids and their decoding as text.

    ``source`` names the data in errors: a chunk size under 2 (nothing would be predicted) or
    a stream shorter than one chunk is a :class:`GradleakError` that says what to change.
    """
    if size < 2:
        raise GradleakError(
            f"--chunk-tokens must be at least 2 (a sample predicts its tokens 2..N), got {size}"
        )
    stream = token_stream(examples, tokenizer)
    count = len(stream) // size
    if count == 0:
        raise GradleakError(
            f"{source} has {len(stream)} tokens, fewer than one chunk of {size}: lower "
            "--chunk-tokens or choose a larger split"
        )
    chunks = [tuple(stream[i * size : (i + 1) * size]) for i in range(count)]
    texts = tokenizer.batch_decode([list(chunk) for chunk in chunks])
    return [Example(text=text, token_ids=chunk) for text, chunk in zip(texts, chunks, strict=True)]
