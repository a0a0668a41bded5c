"""Attention masks per sequence, as the planner takes them.

A mask says, for query row i of a sequence of length L, which keys it may see: a sorted list of
disjoint half-open ranges [begin, end) inside [0, L). The named kinds have closed forms (the
planner cuts them into tiles by interval arithmetic, never per token); `ranges` spells every row
out and has no limit on ranges per row.

Each helper returns a spec: (kind, params, rows), what dcp._dcp.make_batch reads. `allowed_ranges`
evaluates any spec row by row in plain Python: the reference the tests and examples check the
kernels against, written apart from the C++ closed forms on purpose.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

Spec = Tuple[str, List[int], List[List[Tuple[int, int]]]]


def full() -> Spec:
    """Every query sees every key of its sequence."""
    return ("full", [], [])


def causal() -> Spec:
    """Row i sees keys [0, i]."""
    return ("causal", [], [])


def lambda_mask(sink: int = 64, window: int = 4096) -> Spec:
    """Attention sink plus sliding window: row i sees [0, min(sink, i+1)) and [i-window+1, i]."""
    return ("lambda", [int(sink), int(window)], [])


def causal_blockwise(block: int = 256, local_blocks: int = 2, sink_blocks: int = 1) -> Spec:
    """Blocks of `block` tokens. Rows of the first `sink_blocks` blocks and of the last block are
    causal; a row of a block b in between sees the sink blocks and, causally, blocks b-local_blocks
    up to its own."""
    return ("causal_blockwise", [int(block), int(local_blocks), int(sink_blocks)], [])


def chunked(chunk: int = 8192) -> Spec:
    """Local attention in chunks (Llama 4's chunked layers): row i sees its own chunk causally,
    keys [chunk * (i // chunk), i]."""
    return ("chunked", [int(chunk)], [])


def shared_question(question: int, answers: Sequence[int]) -> Spec:
    """A question of `question` tokens followed by answers that each see the question and,
    causally, themselves. question + sum(answers) must be the sequence's length."""
    return ("shared_question", [int(question)] + [int(a) for a in answers], [])


def shared_question_for(length: int, question_fraction: float = 0.2, num_answers: int = 4) -> Spec:
    """shared_question with the question `question_fraction` of `length` and the rest cut into
    `num_answers` answers of nearly equal length (the first ones one token longer)."""
    q = max(1, min(length - 1, int(length * question_fraction))) if length > 1 else length
    rest = length - q
    n = max(1, min(num_answers, rest)) if rest > 0 else 0
    answers = [rest // n + (1 if i < rest % n else 0) for i in range(n)] if n else []
    if not answers:
        return causal()
    return shared_question(q, answers)


def ranges(rows: Sequence[Sequence[Tuple[int, int]]]) -> Spec:
    """Explicit allowed key ranges of every row (sorted, disjoint, half-open; rows may be empty)."""
    return ("ranges", [], [[(int(b), int(e)) for b, e in row] for row in rows])


def normalize(mask) -> Spec:
    """A spec from a spec, a kind name ('causal', 'full', 'lambda', 'causal_blockwise'), or a dict
    {'kind': ..., other fields as the helpers name them}."""
    if isinstance(mask, tuple) and len(mask) == 3:
        return mask
    if isinstance(mask, str):
        named = {"causal": causal, "full": full, "lambda": lambda_mask, "causal_blockwise": causal_blockwise,
                 "chunked": chunked}
        if mask not in named:
            raise ValueError(f"mask '{mask}': a name must be one of {sorted(named)} (others need parameters)")
        return named[mask]()
    if isinstance(mask, dict):
        d = dict(mask)
        kind = d.pop("kind", None)
        makers = {"causal": causal, "full": full, "lambda": lambda_mask, "causal_blockwise": causal_blockwise,
                  "chunked": chunked, "shared_question": shared_question, "ranges": ranges}
        if kind not in makers:
            raise ValueError(f"mask {mask!r}: 'kind' must be one of {sorted(makers)}")
        return makers[kind](**d)
    raise TypeError(f"mask {mask!r}: expected a dcp.masks spec, a kind name or a dict")


def allowed_ranges(spec: Spec, length: int, row: int) -> List[Tuple[int, int]]:
    """The allowed key ranges of `row` in a sequence of `length` tokens (sorted, merged)."""
    kind, p, rows = normalize(spec)
    i = row
    if kind == "full":
        out = [(0, length)]
    elif kind == "causal":
        out = [(0, i + 1)]
    elif kind == "lambda":
        sink, window = p
        out = [(0, min(sink, i + 1)), (max(0, i - window + 1), i + 1)]
    elif kind == "causal_blockwise":
        block, local, sinks = p
        b, last = i // block, (length + block - 1) // block - 1
        if b < sinks or b == last:
            out = [(0, i + 1)]
        else:
            out = [(0, sinks * block), (max(sinks * block, (b - local) * block), i + 1)]
    elif kind == "chunked":
        out = [(i // p[0] * p[0], i + 1)]
    elif kind == "shared_question":
        q, answers = p[0], p[1:]
        if i < q:
            out = [(0, i + 1)]
        else:
            start = q
            for a in answers:
                if i < start + a:
                    break
                start += a
            out = [(0, q), (start, i + 1)]
    elif kind == "ranges":
        out = list(rows[i])
    else:
        raise ValueError(f"unknown mask kind {kind}")
    merged: List[Tuple[int, int]] = []
    for b, e in sorted((b, e) for b, e in out if e > b):
        if merged and b <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((b, e))
    return merged
