"""Training data for examples/train.py: real text with heavy-tailed lengths, on every machine.

The corpus is the Python standard library's own .py files (test suites left out: they are many
near-copies), read as bytes; a byte is a token (vocabulary 256). The file list is sorted by path,
so every run on one interpreter sees the same corpus; each epoch visits it in an order shuffled
by the seed alone, so every mode (dcp, the static layouts, FlexAttention, PyTorch's native CP)
trains on the same bytes in the same order.

Steps hold exactly `tokens_per_step` tokens, no padding: files longer than `max_doc` are cut into
documents of at most `max_doc` bytes, documents are laid end to end, and the one that crosses a
step boundary is split there (its two pieces are separate documents, each with its own
positions and mask). Every document's last token has no target.

Masks are chosen per document by kind (mask_spec): causal; lambda (an attention sink plus a
sliding window); shared question, where a document's opening bytes act as the question and the
rest is cut into answers that each see the question and, causally, themselves.
"""
from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

import dcp

IGNORE_INDEX = -100
# Directories of the standard library that are not library source (test suites, installed
# third-party packages, caches).
_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass
class Corpus:
    root: str
    paths: List[str]  # relative to root, sorted
    sizes: List[int]  # bytes

    def read(self, i: int) -> bytes:
        with open(os.path.join(self.root, self.paths[i]), "rb") as f:
            return f.read()

    def describe(self) -> Dict[str, object]:
        """What the results record so that runs on different machines can be told apart."""
        sizes = sorted(self.sizes)
        digest = hashlib.sha256("\n".join(f"{p}\t{s}" for p, s in zip(self.paths, self.sizes)).encode()).hexdigest()
        return {"root": self.root, "files": len(sizes), "bytes": int(sum(sizes)),
                "median_bytes": int(sizes[len(sizes) // 2]), "p90_bytes": int(sizes[int(0.9 * (len(sizes) - 1))]),
                "max_bytes": int(sizes[-1]), "list_sha256": digest[:16]}


def text_corpus(root: Optional[str] = None, suffix: str = ".py") -> Corpus:
    """Every non-empty `suffix` file under `root` (default: this interpreter's standard library)."""
    root = os.path.realpath(root or sysconfig.get_paths()["stdlib"])
    paths, sizes = [], []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for name in files:
            if name.endswith(suffix):
                path = os.path.join(directory, name)
                size = os.path.getsize(path)
                if size > 0:
                    paths.append(os.path.relpath(path, root))
                    sizes.append(size)
    if not paths:
        raise ValueError(f"corpus: no non-empty {suffix} files under {root}")
    order = sorted(range(len(paths)), key=lambda i: paths[i])
    return Corpus(root, [paths[i] for i in order], [sizes[i] for i in order])


@dataclass
class Step:
    """One global batch: `tokens` (uint8, exactly tokens_per_step) holding documents of `lengths`
    end to end, and one mask spec per document."""
    index: int
    tokens: np.ndarray
    lengths: List[int]
    masks: List[tuple] = field(default_factory=list)
    # A model whose layers attend differently (a layer pattern, layer_pattern): the documents'
    # masks of every kind in the pattern, the first kind's being `masks`.
    kind_masks: Dict[str, List[tuple]] = field(default_factory=dict)

    def labels(self) -> np.ndarray:
        """Next-byte targets inside each document; IGNORE_INDEX on every document's last token."""
        labels = np.full(self.tokens.shape[0], IGNORE_INDEX, dtype=np.int64)
        labels[:-1] = self.tokens[1:]
        ends = np.cumsum(self.lengths) - 1
        labels[ends] = IGNORE_INDEX
        return labels

    def positions(self) -> np.ndarray:
        """Each token's position inside its document (RoPE ids of the whole batch)."""
        starts = np.repeat(np.cumsum([0] + self.lengths[:-1]), self.lengths)
        return np.arange(self.tokens.shape[0], dtype=np.int64) - starts


def _documents(corpus: Corpus, max_doc: int, seed: int) -> Iterator[np.ndarray]:
    """Documents forever: epoch e visits the files in the order of random.Random(seed + e)."""
    epoch = 0
    while True:
        order = list(range(len(corpus.paths)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        for i in order:
            data = np.frombuffer(corpus.read(i), dtype=np.uint8)
            for start in range(0, data.shape[0], max_doc):
                yield data[start:start + max_doc]
        epoch += 1


def steps(corpus: Corpus, tokens_per_step: int, max_doc: int, seed: int, mask: str,
          sink: int = 64, window: int = 4096, question_fraction: float = 0.2,
          num_answers: int = 4, chunk: int = 8192) -> Iterator[Step]:
    """Steps 0, 1, 2, ...: a deterministic function of the corpus and the arguments (`mask`: a
    kind or a layer pattern, layer_pattern)."""
    if tokens_per_step < 1 or max_doc < 1:
        raise ValueError(f"tokens_per_step={tokens_per_step}, max_doc={max_doc}: both must be >= 1")
    docs = _documents(corpus, max_doc, seed)
    carry: Optional[np.ndarray] = None
    index = 0
    while True:
        pieces: List[np.ndarray] = []
        room = tokens_per_step
        while room > 0:
            doc = carry if carry is not None else next(docs)
            carry = None
            if doc.shape[0] > room:  # split at the step boundary; the rest opens the next step
                doc, carry = doc[:room], doc[room:]
            pieces.append(doc)
            room -= doc.shape[0]
        lengths = [int(p.shape[0]) for p in pieces]
        kind_masks = {k: [mask_spec(k, n, sink, window, question_fraction, num_answers, chunk) for n in lengths]
                      for k in dict.fromkeys(layer_pattern(mask))}
        yield Step(index, np.concatenate(pieces), lengths, next(iter(kind_masks.values())), kind_masks)
        index += 1


MASKS = ("causal", "lambda", "shared_question", "chunked")


def layer_pattern(mask: str) -> List[str]:
    """The mask kind of each layer, cycled over the model's layers: a kind ("causal"), or kinds
    joined by '+', each repeated by '*N' ("lambda*3+causal": three sliding-window layers, then a
    global one, as recent models interleave them). Raises ValueError naming what is wrong."""
    kinds: List[str] = []
    for part in mask.split("+"):
        kind, _, times = part.partition("*")
        if kind not in MASKS:
            raise ValueError(f"mask '{mask}': '{kind}' is not one of {', '.join(MASKS)}")
        if times and (not times.isdigit() or int(times) < 1):
            raise ValueError(f"mask '{mask}': '*{times}' must repeat a kind a positive number of times")
        kinds += [kind] * (int(times) if times else 1)
    return kinds


def mask_spec(kind: str, length: int, sink: int, window: int, question_fraction: float, num_answers: int,
              chunk: int = 8192):
    """The dcp mask spec of one document of `length` tokens."""
    if kind == "causal":
        return dcp.masks.causal()
    if kind == "lambda":
        return dcp.masks.lambda_mask(sink, window)
    if kind == "shared_question":
        # Documents too short to hold a question and an answer stay causal (the helper says so).
        return dcp.masks.shared_question_for(length, question_fraction, num_answers)
    if kind == "chunked":
        return dcp.masks.chunked(chunk)
    raise ValueError(f"mask '{kind}': expected one of {', '.join(MASKS)}")


def token_tables(step: Step, masks: Optional[List[tuple]] = None) -> Dict[str, np.ndarray]:
    """Per-token tables (int64, one entry per token of the batch; of `masks`, default the step's) from which a FlexAttention
    mask_mod evaluates any of the three masks with a few gathers, never per document:
      doc          document index
      start        the document's first token (global index)
      question_end end of the document's question (global); a causal document's question is
                   the whole document, so every key before the query is allowed
      segment      first token of the query's own segment: the answer it lies in, or the
                   document's start for question tokens
      chunk_start  first token of the query's chunk (chunked masks; the document's start
                   otherwise)
    Row q of the batch sees key k iff doc[k] == doc[q], k <= q, and, by kind:
      causal: nothing more; lambda: k - start[q] < sink or q - k < window;
      shared question: k < question_end[q] or k >= segment[q];
      chunked: k >= chunk_start[q]."""
    n = step.tokens.shape[0]
    masks = step.masks if masks is None else masks
    doc = np.repeat(np.arange(len(step.lengths), dtype=np.int64), step.lengths)
    starts = np.cumsum([0] + step.lengths[:-1]).astype(np.int64)
    start = starts[doc]
    question_end = np.empty(n, dtype=np.int64)
    segment = np.empty(n, dtype=np.int64)
    chunk_start = start.copy()
    for d, (s, length, spec) in enumerate(zip(starts, step.lengths, masks)):
        kind, params, _ = spec
        if kind == "chunked":
            chunk_start[s:s + length] = s + np.arange(length, dtype=np.int64) // params[0] * params[0]
        if kind == "shared_question":
            q, answers = params[0], params[1:]
            question_end[s:s + length] = s + q
            segment[s:s + q] = s
            at = s + q
            for a in answers:
                segment[at:at + a] = at
                at += a
        else:
            question_end[s:s + length] = s + length
            segment[s:s + length] = s
    return {"doc": doc, "start": start, "question_end": question_end, "segment": segment, "chunk_start": chunk_start}


def rank_share(step: Step, rank: int, world: int) -> Tuple[int, int]:
    """The documents [first, last) that rank `rank` of `world` reads when every rank loads its own
    share of a step (per-rank data): those starting in its 1/world of the tokens. Packed in rank
    order the shares are the step itself."""
    starts = np.cumsum([0] + step.lengths[:-1])
    total = int(step.tokens.shape[0])
    first, last = (int(np.searchsorted(starts, r * total // world)) for r in (rank, rank + 1))
    return first, last


def describe_steps(batches: Sequence[Step]) -> Dict[str, object]:
    """Document count and length spread over some steps (for the results)."""
    lengths = sorted(n for s in batches for n in s.lengths)
    if not lengths:
        return {}
    return {"steps": len(batches), "documents": len(lengths), "median_doc": lengths[len(lengths) // 2],
            "max_doc": lengths[-1], "docs_per_step": round(len(lengths) / len(batches), 2)}


def first_step_checksum(step: Step) -> str:
    """A short digest of a step's bytes and cuts: equal digests mean equal data across runs."""
    h = hashlib.sha256(step.tokens.tobytes())
    h.update(np.asarray(step.lengths, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def document_lengths(corpus: Corpus, max_doc: int) -> List[int]:
    """The corpus's document lengths in tokens: each file cut into pieces of at most max_doc bytes."""
    out: List[int] = []
    for size in corpus.sizes:
        out.extend([max_doc] * (size // max_doc) + ([size % max_doc] if size % max_doc else []))
    return out


def main(argv=None) -> int:
    """`lengths`: the corpus's document lengths, one per line, for `dcp simulate --lengths FILE`."""
    import argparse

    p = argparse.ArgumentParser(description="The training corpus's document lengths, one per line: what dcp "
                                            "would do with them, `dcp simulate --lengths FILE`.")
    p.add_argument("what", choices=("lengths",))
    p.add_argument("--max-doc", type=int, default=65536, help="documents longer than this are cut (train.py's)")
    p.add_argument("--data", default=None, help="directory of .py files (default: this Python's standard library)")
    args = p.parse_args(argv)
    corpus = text_corpus(args.data)
    info = corpus.describe()
    print(f"# {info['files']} files under {info['root']}, cut at {args.max_doc} tokens (bytes)")
    print("\n".join(str(n) for n in document_lengths(corpus, args.max_doc)))
    return 0


__all__ = ["Corpus", "IGNORE_INDEX", "MASKS", "Step", "text_corpus", "steps", "mask_spec", "token_tables", "layer_pattern",
           "describe_steps", "document_lengths", "first_step_checksum", "rank_share"]

if __name__ == "__main__":
    raise SystemExit(main())
