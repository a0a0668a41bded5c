"""Dispatch then undispatch is the identity; positions restart at every document."""
import torch

import cases
from ranks import run_ranks


def check(result):
    assert result["identity"]
    lengths = result["lengths"]
    want = torch.cat([torch.arange(n) for n in lengths])
    assert torch.equal(result["positions"], want)


def test_dispatch_roundtrip_one_rank():
    check(run_ranks(1, cases.dispatch_case, 11)[0])


def test_dispatch_roundtrip_two_ranks():
    results = run_ranks(2, cases.dispatch_case, 12)
    for r in results:
        check(r)
    assert results[0]["tokens"] + results[1]["tokens"] == results[0]["total"]
