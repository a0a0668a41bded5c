#!/usr/bin/env python3
"""Writes the JSON corpora of the batch, dataset and cluster fuzz targets.

    make_json_corpus.py OUT_DIR        (OUT_DIR/batch, OUT_DIR/dataset, OUT_DIR/cluster)

Each target gets seed/ (inputs to start fuzzing from), good/ (edge cases that must be accepted)
and bad/ (inputs that must be refused). Bad inputs are made three ways: every valid seed cut at
every byte before its end, every field given every wrong value it can take (type, sign, zero,
range, limit, overflow), and structural faults (unknown, missing and duplicate keys). What is bad
is decided here by construction, never by running dcp, so the corpus checks dcp rather than
mirroring it. Deterministic: the same script writes the same files.
"""
import json
import os
import sys

MAX_TOKENS = 2**31 - 1
MAX_HEADS = 1024
MAX_DIM = 1024


def dump(obj):
    return json.dumps(obj, separators=(", ", ": "))


def safe(name):
    """A file name for a case name (values may hold any character)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def with_path(obj, path, value):
    """A deep copy of obj with obj[path...] = value (value None with delete=True removes)."""
    obj = json.loads(json.dumps(obj))
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return obj


def without(obj, path):
    obj = json.loads(json.dumps(obj))
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    del cur[path[-1]]
    return obj


# Values of the wrong JSON type for an integer field, and integers no field accepts.
WRONG_TYPES = [("string", '"7"'), ("null", "null"), ("true", "true"), ("array", "[7]"), ("object", '{"v": 7}'),
               ("float", "7.5"), ("exp-float", "7e0"), ("overflow", "1e400"), ("neg-overflow", "-1e400"),
               ("int64-overflow", "99999999999999999999999")]


def raw_with(obj, path, raw):
    """Text of obj with the field at path replaced by the raw JSON literal `raw`."""
    marker = "__RAW_VALUE__"
    return dump(with_path(obj, path, marker)).replace('"%s"' % marker, raw)


def batch_corpus(out):
    base = {"heads": {"q": 4, "kv": 2, "dim": 64}, "dtype": "fp32",
            "sequences": [{"id": "a", "length": 100, "mask": {"kind": "causal"}},
                          {"length": 40, "mask": {"kind": "lambda", "sink": 4, "window": 16}},
                          {"length": 60, "mask": {"kind": "causal_blockwise", "block": 16, "local": 1, "sink": 1}},
                          {"length": 30, "mask": {"kind": "shared_question", "question": 10, "answers": [5, 5, 10]}},
                          {"length": 20, "mask": {"kind": "full"}},
                          {"length": 4, "mask": {"kind": "ranges", "rows": [[[0, 1]], [], [[0, 1], [2, 3]], [[3, 4]]]}}]}
    seeds = {
        "all-masks": base,
        "one-token": {"sequences": [{"length": 1}]},
        "defaults": {"sequences": [{"length": 300}, {"length": 17, "mask": {"kind": "shared_question"}}]},
        "bf16-gqa": {"heads": {"q": 32, "kv": 8, "dim": 128}, "dtype": "bf16",
                     "sequences": [{"length": 2048, "mask": {"kind": "lambda"}}]},
    }
    for name, obj in seeds.items():
        write(f"{out}/seed/{name}.json", dump(obj))
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "batch_example.json")) as f:
        write(f"{out}/seed/example.json", f.read())

    good = {
        "one-token-causal": {"sequences": [{"length": 1, "mask": {"kind": "causal"}}]},
        "one-token-ranges-empty": {"sequences": [{"length": 1, "mask": {"kind": "ranges", "rows": [[]]}}]},
        "own-key-only": {"sequences": [{"length": 5, "mask": {"kind": "ranges",
                                                                "rows": [[[i, i + 1]] for i in range(5)]}}]},
        "mqa": {"heads": {"q": 8, "kv": 1, "dim": 8}, "sequences": [{"length": 3}]},
        "heads-at-limit": {"heads": {"q": MAX_HEADS, "kv": MAX_HEADS, "dim": 8}, "sequences": [{"length": 2}]},
        "dim-at-limit": {"heads": {"q": 1, "kv": 1, "dim": MAX_DIM}, "sequences": [{"length": 2}]},
        "tokens-at-limit": {"sequences": [{"length": MAX_TOKENS}]},
        "tokens-at-limit-split": {"sequences": [{"length": MAX_TOKENS - 5}, {"length": 5}]},
        "lambda-window-1": {"sequences": [{"length": 9, "mask": {"kind": "lambda", "sink": 0, "window": 1}}]},
        "lambda-huge-window": {"sequences": [{"length": 9, "mask": {"kind": "lambda", "sink": 2**62, "window": 2**62}}]},
        "blockwise-huge": {"sequences": [{"length": 9, "mask": {"kind": "causal_blockwise", "block": 2**62,
                                                                 "local": 2**62, "sink": 2**62}}]},
        "shared-question-minimal": {"sequences": [{"length": 5, "mask": {"kind": "shared_question"}}]},
        "shared-question-no-question": {"sequences": [{"length": 3, "mask": {"kind": "shared_question",
                                                                              "question": 0, "answers": [1, 2]}}]},
        "shared-question-answers-only": {"sequences": [{"length": 6, "mask": {"kind": "shared_question",
                                                                               "answers": [2, 2]}}]},
        "unicode-id": {"sequences": [{"id": "\u00e9\u4e2d\U0001F600", "length": 2}]},
        "escaped-key-order": {"sequences": [{"mask": {"kind": "full"}, "length": 2, "id": "x\"y\\z"}], "dtype": "bf16"},
        "fp16": {"dtype": "fp16", "sequences": [{"length": 2}]},
        "zero-exponent-int": {"sequences": [{"length": 2}], "heads": {"q": 2, "kv": 2, "dim": 16}},
    }
    for name, obj in good.items():
        write(f"{out}/good/{name}.json", dump(obj))
    write(f"{out}/good/whitespace.json", "\n\t " + dump(seeds["one-token"]) + " \r\n\t")
    write(f"{out}/good/bom-free-utf8-id.json", '{"sequences": [{"id": "caf\\u00e9", "length": 3}]}')

    bad = {}
    # Every cut of the seed before its last byte (a cut JSON value never parses).
    text = dump(base)
    for n in range(0, len(text) - 1, 3):
        bad[f"cut-{n:04d}"] = text[:n]
    for n in range(len(dump(seeds["one-token"])) - 1):
        bad[f"cut-small-{n:02d}"] = dump(seeds["one-token"])[:n]
    # Integer fields: wrong types and out-of-range values.
    int_fields = {
        "heads-q": (["heads", "q"], [0, -1, MAX_HEADS + 2, 2**31, 3]),
        "heads-kv": (["heads", "kv"], [0, -2, 3, 8, 2**31]),
        "heads-dim": (["heads", "dim"], [0, -8, 12, MAX_DIM + 8, 2**31, 1]),
        "length": (["sequences", 0, "length"], [0, -1, MAX_TOKENS + 1, 2**63 - 1, -(2**63)]),
        "lambda-sink": (["sequences", 1, "mask", "sink"], [-1, -(2**63)]),
        "lambda-window": (["sequences", 1, "mask", "window"], [0, -5]),
        "blockwise-block": (["sequences", 2, "mask", "block"], [0, -16]),
        "blockwise-local": (["sequences", 2, "mask", "local"], [-1]),
        "blockwise-sink": (["sequences", 2, "mask", "sink"], [-1]),
        "question": (["sequences", 3, "mask", "question"], [-1, 31, 11, 9, 2**62]),
        "answer": (["sequences", 3, "mask", "answers", 0], [0, -5, 6, 31, 2**62]),
    }
    for name, (path, values) in int_fields.items():
        for v in values:
            bad[f"{name}-value-{v}"] = dump(with_path(base, path, v))
        for tname, raw in WRONG_TYPES:
            bad[f"{name}-type-{tname}"] = raw_with(base, path, raw)
    # Strings and enums.
    for v in ["fp8", "FP32", "", "bf16 ", "float32"]:
        bad[f"dtype-{v or 'empty'}"] = dump(with_path(base, ["dtype"], v))
    for tname, raw in WRONG_TYPES[1:6]:
        bad[f"dtype-type-{tname}"] = raw_with(base, ["dtype"], raw)
        bad[f"id-type-{tname}"] = raw_with(base, ["sequences", 0, "id"], raw)
        bad[f"mask-kind-type-{tname}"] = raw_with(base, ["sequences", 0, "mask", "kind"], raw)
    for v in ["Causal", "sliding", "", "ranges ", "lambda\u0000"]:
        bad[f"mask-kind-{v.strip() or 'empty'}-{len(v)}"] = dump(with_path(base, ["sequences", 0, "mask", "kind"], v))
    # Containers of the wrong shape.
    for tname, raw in [("null", "null"), ("object", "{}"), ("number", "3"), ("string", '"x"'), ("empty", "[]")]:
        bad[f"sequences-{tname}"] = raw_with(base, ["sequences"], raw)
        if tname != "empty":
            bad[f"heads-{tname}"] = raw_with(base, ["heads"], raw.replace("{}", "[]"))
            bad[f"sequence-{tname}"] = raw_with(base, ["sequences", 0], raw.replace("{}", "[]"))
            bad[f"mask-{tname}"] = raw_with(base, ["sequences", 0, "mask"], raw.replace("{}", "[]"))
    for name, text_ in [("top-array", "[]"), ("top-number", "1"), ("top-string", '"batch"'), ("empty-file", ""),
                        ("top-null", "null"), ("two-objects", dump(seeds["one-token"]) * 2),
                        ("trailing-comma", '{"sequences": [{"length": 1},]}'), ("comment", '{"sequences": [] /* x */}'),
                        ("nan-literal", '{"sequences": [{"length": NaN}]}'),
                        ("single-quotes", "{'sequences': [{'length': 1}]}"),
                        ("bad-escape", '{"sequences": [{"id": "\\x41", "length": 1}]}')]:
        bad[name] = text_
    # Keys: unknown, missing, duplicated (the last would silently win).
    bad["unknown-top-key"] = dump(with_path(base, ["seqs"], []))
    bad["unknown-heads-key"] = dump(with_path(base, ["heads", "groups"], 2))
    bad["unknown-sequence-key"] = dump(with_path(base, ["sequences", 0, "len"], 5))
    bad["unknown-mask-key"] = dump(with_path(base, ["sequences", 0, "mask", "window"], 5))
    bad["missing-sequences"] = dump(without(base, ["sequences"]))
    bad["missing-length"] = dump(without(base, ["sequences", 0, "length"]))
    bad["missing-kind"] = dump(without(base, ["sequences", 0, "mask", "kind"]))
    bad["missing-rows"] = dump(without(base, ["sequences", 5, "mask", "rows"]))
    for key, where in [("heads", ""), ("dtype", ""), ("sequences", ""), ("q", "heads"), ("length", "seq"),
                       ("kind", "mask"), ("window", "lambda"), ("answers", "sq")]:
        t = dump(base)
        anchor = {"": '{"heads"', "heads": '"q": 4', "seq": '"length": 100', "mask": '"kind": "causal"',
                  "lambda": '"window": 16', "sq": '"answers": [5, 5, 10]'}[where]
        dup = {"": '{"%s": %s, "heads"' % (key, {"heads": '{"q": 2, "kv": 2, "dim": 8}', "dtype": '"bf16"',
                                                 "sequences": '[{"length": 9}]'}[key])}.get(where) if where == "" else None
        if where == "":
            t = t.replace(anchor, dup, 1)
        elif where == "heads":
            t = t.replace(anchor, '"q": 8, "q": 4', 1)
        elif where == "seq":
            t = t.replace(anchor, '"length": 7, "length": 100', 1)
        elif where == "mask":
            t = t.replace(anchor, '"kind": "full", "kind": "causal"', 1)
        elif where == "lambda":
            t = t.replace(anchor, '"window": 3, "window": 16', 1)
        else:
            t = t.replace(anchor, '"answers": [30], "answers": [5, 5, 10]', 1)
        bad[f"duplicate-{where or 'top'}-{key}"] = t
    # Ranges masks: rows of the wrong count, ranges empty, reversed, overlapping, outside.
    rows_path = ["sequences", 5, "mask", "rows"]
    for name, rows in [("too-few", [[[0, 1]]] * 3), ("too-many", [[[0, 1]]] * 5), ("empty-range", [[[1, 1]], [], [], []]),
                       ("reversed", [[[2, 1]], [], [], []]), ("overlap", [[[0, 2], [1, 3]], [], [], []]),
                       ("unsorted", [[[2, 3], [0, 1]], [], [], []]), ("touching-ok-but-past-end", [[[0, 5]], [], [], []]),
                       ("negative", [[[-1, 1]], [], [], []]), ("triple", [[[0, 1, 2]], [], [], []]),
                       ("single", [[[0]], [], [], []]), ("not-pairs", [[0, 1], [], [], []]),
                       ("float", [[[0, 1.5]], [], [], []]), ("row-not-array", [5, [], [], []]),
                       ("huge-end", [[[0, 2**62]], [], [], []])]:
        bad[f"ranges-{name}"] = dump(with_path(base, rows_path, rows))
    # Limits: sums beyond the token limit, more sequences than the mask allows.
    bad["tokens-over-limit-sum"] = dump({"sequences": [{"length": MAX_TOKENS}, {"length": 1}]})
    bad["tokens-over-limit-many"] = dump({"sequences": [{"length": 2**30}] * 3})
    bad["shared-question-too-short"] = dump({"sequences": [{"length": 4, "mask": {"kind": "shared_question"}}]})
    bad["shared-question-answers-empty"] = dump({"sequences": [{"length": 4, "mask": {"kind": "shared_question",
                                                                                     "answers": []}}]})
    bad["shared-question-default-answers-too-few"] = dump({"sequences": [{"length": 6, "mask": {
        "kind": "shared_question", "question": 3}}]})
    bad["heads-product-overflow"] = dump({"heads": {"q": 2**31 - 1, "kv": 1, "dim": 2**31 - 8}, "sequences": [{"length": 1}]})
    for name, text_ in bad.items():
        write(f"{out}/bad/{safe(name)}.json", text_)
    with open(f"{out}/bad/invalid-utf8.json", "wb") as f:  # a byte that is no UTF-8
        f.write(b'{"sequences": [{"id": "\xff", "length": 1}]}')
    return len(bad) + 1


def dataset_corpus(out):
    lines = [dump({"sequences": [{"length": 50}, {"length": 20, "mask": {"kind": "lambda", "sink": 1, "window": 4}}]}),
             dump({"heads": {"q": 2, "kv": 1, "dim": 8}, "sequences": [{"length": 7, "mask": {"kind": "full"}}]}),
             dump({"dtype": "bf16", "sequences": [{"length": 33, "mask": {"kind": "shared_question"}}]})]
    write(f"{out}/seed/three.jsonl", "\n".join(lines) + "\n")
    write(f"{out}/seed/one.jsonl", lines[0] + "\n")
    write(f"{out}/good/blank-lines.jsonl", "\n \n" + lines[0] + "\n\n\t\n" + lines[1] + "\r\n")
    write(f"{out}/good/no-final-newline.jsonl", lines[0] + "\n" + lines[1])
    write(f"{out}/good/crlf.jsonl", "\r\n".join(lines) + "\r\n")
    bad = {"empty": "", "blank-only": "\n \n\t\n", "pretty-printed": json.dumps(json.loads(lines[0]), indent=2) + "\n",
           "array-of-batches": "[" + ",".join(lines) + "]\n", "two-on-one-line": lines[0] + " " + lines[1] + "\n"}
    text = "\n".join(lines) + "\n"
    # Cuts inside a line (a cut between lines leaves whole batches, which is fine).
    for n in range(1, len(text) - 1, 4):
        tail = text[:n].split("\n")[-1]
        if tail.strip() and tail not in lines:
            bad[f"cut-{n:04d}"] = text[:n]
    # One bad batch among good lines, at the start, middle and end.
    batch_bad = [("zero-length", {"sequences": [{"length": 0}]}), ("no-sequences", {"sequences": []}),
                 ("bad-kind", {"sequences": [{"length": 3, "mask": {"kind": "diag"}}]}),
                 ("kv-not-dividing", {"heads": {"q": 3, "kv": 2, "dim": 8}, "sequences": [{"length": 3}]}),
                 ("dim-not-multiple-of-8", {"heads": {"q": 2, "kv": 2, "dim": 4}, "sequences": [{"length": 3}]})]
    for name, obj in batch_bad:
        for pos in range(3):
            ls = list(lines)
            ls.insert(pos, dump(obj))
            bad[f"{name}-at-line-{pos + 1}"] = "\n".join(ls) + "\n"
    ls = list(lines)
    ls[1] = ls[1].replace('"length": 7', '"length": 7, "length": 8')
    bad["duplicate-key-line-2"] = "\n".join(ls) + "\n"
    ls[1] = lines[1].replace("7", "1e400")
    bad["number-overflow-line-2"] = "\n".join(ls) + "\n"
    for name, text_ in bad.items():
        write(f"{out}/bad/{safe(name)}.jsonl", text_)
    return len(bad)


def cluster_corpus(out):
    custom = {"name": "lab", "nodes": 2, "devices_per_node": 4, "intra_bw_GBps": 300, "inter_bw_device_GBps": 25,
              "nic_bw_node_GBps": 100, "intra_latency_us": 5, "inter_latency_us": 15, "attn_fwd_TFLOPs": 400,
              "attn_bwd_TFLOPs": 300, "device_memory_GB": 80}
    seeds = {"custom": custom, "preset": {"preset": "h200-nvl", "nodes": 4},
             "preset-overrides": {"preset": "a100-p4d", "nodes": 2, "devices_per_node": 4, "inter_bw_device_GBps": 10}}
    for name, obj in seeds.items():
        write(f"{out}/seed/{name}.json", dump(obj))
    good = {"preset-only": {"preset": "a100-p4d"}, "zero-latency": with_path(custom, ["intra_latency_us"], 0),
            "one-device": with_path(with_path(custom, ["nodes"], 1), ["devices_per_node"], 1),
            "max-devices": with_path(with_path(custom, ["nodes"], 8), ["devices_per_node"], 1024),
            "max-nodes": with_path(with_path(custom, ["nodes"], 1024), ["devices_per_node"], 8),
            "tiny-bandwidth": with_path(custom, ["intra_bw_GBps"], 1e-9), "float-fields": with_path(custom, ["attn_fwd_TFLOPs"], 1.5e2),
            "unicode-name": with_path(custom, ["name"], "cl\u00fcster")}
    for name, obj in good.items():
        write(f"{out}/good/{name}.json", dump(obj))
    bad = {}
    text = dump(custom)
    for n in range(0, len(text) - 1, 3):
        bad[f"cut-{n:04d}"] = text[:n]
    for field, values in [("nodes", [0, -1, 1025, 4097, 2**31, 1.5]), ("devices_per_node", [0, -3, 1025, 1.5]),
                          ("name", [7, None])]:
        for v in values:
            bad[f"{field}-{v}"] = dump(with_path(custom, [field], v))
    bad["devices-over-limit"] = dump(with_path(with_path(custom, ["nodes"], 1024), ["devices_per_node"], 9))
    bad["devices-over-limit-preset"] = dump({"preset": "a100-p4d", "nodes": 1024, "devices_per_node": 16})
    for field in ["intra_bw_GBps", "inter_bw_device_GBps", "nic_bw_node_GBps", "attn_fwd_TFLOPs", "attn_bwd_TFLOPs",
                  "device_memory_GB", "intra_latency_us", "inter_latency_us"]:
        values = [-1, -1e-300] + ([] if "latency" in field else [0])
        for v in values:
            bad[f"{field}-{v}"] = dump(with_path(custom, [field], v))
        for tname, raw in WRONG_TYPES[:5] + [("overflow", "1e400"), ("neg-overflow", "-1e400")]:
            bad[f"{field}-type-{tname}"] = raw_with(custom, [field], raw)
        bad[f"missing-{field}"] = dump(without(custom, [field])) if "latency" not in field else dump(
            with_path(custom, [field], "5us"))
    for name, obj in [("unknown-preset", {"preset": "a100"}), ("preset-type", {"preset": 1}),
                      ("preset-null", {"preset": None}), ("unknown-key", with_path(custom, ["gpus"], 8)),
                      ("missing-nodes", without(custom, ["nodes"])), ("missing-devices", without(custom, ["devices_per_node"])),
                      ("empty-object", {}), ("preset-unknown-key", {"preset": "a100-p4d", "node": 2})]:
        bad[name] = dump(obj)
    for name, text_ in [("top-array", "[]"), ("empty-file", ""), ("top-string", '"a100-p4d"'),
                        ("duplicate-nodes", text.replace('"nodes": 2', '"nodes": 2, "nodes": 3', 1)),
                        ("duplicate-preset", '{"preset": "a100-p4d", "preset": "h200-nvl"}')]:
        bad[name] = text_
    for name, text_ in bad.items():
        write(f"{out}/bad/{safe(name)}.json", text_)
    return len(bad)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    out = sys.argv[1]
    n = batch_corpus(f"{out}/batch") + dataset_corpus(f"{out}/dataset") + cluster_corpus(f"{out}/cluster")
    print(f"json corpus: {n} bad inputs")


if __name__ == "__main__":
    main()
