"""FASTA corpus: record-bounded windows, strands, determinism, eval tiling, real data."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import PHIX  # noqa: E402  (../shared beside the repository)

from evspark_cli.errors import InputError
from evspark_cli.eval.score import iter_eval_windows
from evspark_cli.train.corpus import Corpus, fasta_files, read_fasta, reverse_complement


def write_fasta(path: Path, records: list[tuple[str, str]], gz: bool = False) -> Path:
    text = "".join(f">{name} test record\n" + "".join(seq[i:i + 60] + "\n"
                                                     for i in range(0, len(seq), 60))
                   for name, seq in records)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture()
def tiny(tmp_path: Path) -> Corpus:
    """3 records of distinct letters over 2 files (one gzip), plus one too short to sample."""
    d = tmp_path / "split"
    d.mkdir()
    write_fasta(d / "a.fa", [("recA", "A" * 50), ("recC", "c" * 120)])
    write_fasta(d / "b.fa.gz", [("recG", "G" * 80), ("short", "T" * 5)], gz=True)
    (d / "notes.txt").write_text("ignored")
    return Corpus.from_paths(d)


def test_reading_and_metadata(tiny: Corpus) -> None:
    assert [r.name for r in tiny.records] == ["recA", "recC", "recG", "short"]
    assert [r.source.name for r in tiny.records] == ["a.fa", "a.fa", "b.fa.gz", "b.fa.gz"]
    assert tiny.lengths.tolist() == [50, 120, 80, 5]
    rec = tiny.records[1]
    assert rec.seq.dtype == np.uint8 and set(rec.seq.tolist()) == {ord("C")}  # upper-cased
    assert rec.description == "test record"  # the header after the id, as for prompts
    assert tiny.records[2].name == "recG" and len(tiny) == 4


def test_windows_never_cross_records(tiny: Corpus) -> None:
    g = torch.Generator().manual_seed(1)
    w = tiny.sample_windows(512, 20, g, rc_prob=0.0)
    assert w.shape == (512, 21) and w.dtype == torch.int64
    assert (w == w[:, :1]).all()  # one letter per window: no window mixes records
    letters = set(w[:, 0].tolist())
    assert letters == {ord("A"), ord("C"), ord("G")}  # "short" (5 < 21) never drawn
    # records weighted by number of windows: C (100 starts) > G (60) > A (30)
    counts = {c: int((w[:, 0] == c).sum()) for c in letters}
    assert counts[ord("C")] > counts[ord("G")] > counts[ord("A")]
    with pytest.raises(ValueError, match="window"):
        tiny.sample_windows(4, 120, g)  # no record has 121 tokens
    assert tiny.sample_windows(4, 119, g).shape == (4, 120)  # exactly the longest record


def test_window_contents_and_positions(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    seqs = ["".join(rng.choice(list("ACGT"), n)) for n in (300, 40, 500)]
    c = Corpus.from_paths(write_fasta(tmp_path / "r.fa",
                                      [(f"r{i}", s) for i, s in enumerate(seqs)]))
    w = c.sample_windows(200, 31, torch.Generator().manual_seed(5), rc_prob=0.0)
    for row in w:
        text = bytes(row.to(torch.uint8).tolist()).decode()
        assert any(text in s for s in seqs)


def encode_sequence(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("ascii"), np.uint8).copy()


def test_reverse_complement_iupac() -> None:
    fwd = encode_sequence("ACGTRYKMBVDHSWNU")
    rc = reverse_complement(fwd)
    assert bytes(rc).decode() == "ANWSDHBVKMRYACGT"
    twice = reverse_complement(reverse_complement(encode_sequence("ACGTRYKMBVDHSWN")))
    assert bytes(twice).decode() == "ACGTRYKMBVDHSWN"
    t = torch.tensor([[65, 67, 71, 84, 82], [78, 83, 87, 75, 77]])
    assert reverse_complement(t).tolist() == [[89, 65, 67, 71, 84], [75, 77, 87, 83, 78]]
    assert reverse_complement(torch.tensor([65], dtype=torch.uint8)).dtype == torch.uint8


def test_both_strands_and_rc_correctness(tmp_path: Path) -> None:
    seq = "AACGTTTGCARYKMBN" * 4  # asymmetric under RC
    c = Corpus.from_paths(write_fasta(tmp_path / "s.fa", [("s", seq)]))
    w = c.sample_windows(400, 15, torch.Generator().manual_seed(3), rc_prob=0.5)
    fwd = rev = 0
    rc_seq = bytes(reverse_complement(encode_sequence(seq))).decode()
    for row in w:
        text = bytes(row.to(torch.uint8).tolist()).decode()
        in_f, in_r = text in seq, text in rc_seq
        assert in_f or in_r
        fwd += in_f and not in_r
        rev += in_r and not in_f
    assert fwd > 100 and rev > 100
    all_rc = c.sample_windows(50, 15, torch.Generator().manual_seed(3), rc_prob=1.0)
    assert all(bytes(r.to(torch.uint8).tolist()).decode() in rc_seq for r in all_rc)


def test_deterministic_by_seed(tiny: Corpus) -> None:
    def draw(seed: int) -> torch.Tensor:
        return tiny.sample_windows(64, 10, torch.Generator().manual_seed(seed))
    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))
    g = torch.Generator().manual_seed(7)
    first, second = tiny.sample_windows(64, 10, g), tiny.sample_windows(64, 10, g)
    assert torch.equal(first, draw(7)) and not torch.equal(first, second)


@pytest.mark.parametrize("n,window,context",
                         [(1, 4, 3), (2, 4, 3), (37, 4, 3), (37, 5, 1), (40, 8, 100), (64, 8, 8)])
def test_eval_tiling_scores_each_position_once(n: int, window: int, context: int) -> None:
    seq = np.arange(n, dtype=np.int64)  # token = its own position, to read positions back
    hits = np.zeros(n, dtype=np.int64)
    for ids, start in iter_eval_windows(seq, window, context):
        assert ids.dtype == torch.int64 and ids.dim() == 1
        assert len(ids) <= context + window and 1 <= start < len(ids)
        positions = ids.tolist()
        assert positions == list(range(positions[0], positions[-1] + 1))  # contiguous slice
        scored = positions[start:]
        assert len(scored) <= window
        assert start == min(context, scored[0])  # first scored position has its full context
        hits[scored] += 1
    assert hits[0] == 0 and (hits[1:] == 1).all()


def test_eval_tiling_on_corpus_record(tiny: Corpus) -> None:
    chunks = list(iter_eval_windows(tiny.records[0].seq, 16, 8))
    assert [s for _, s in chunks] == [1, 8, 8, 8]
    assert sum(len(ids) - s for ids, s in chunks) == 49
    assert torch.equal(chunks[0][0], torch.full((17,), 65))
    for window, context in [(0, 1), (4, 0)]:
        with pytest.raises(ValueError):
            list(iter_eval_windows(np.zeros(3, np.uint8), window, context))


def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="invalid character '-' at position 5"):
        read_fasta(write_fasta(tmp_path / "bad.fa", [("x", "ACGT-ACGT")]))
    with pytest.raises(InputError):
        fasta_files(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no FASTA"):
        fasta_files(empty)
    c = Corpus.from_paths([write_fasta(tmp_path / "e.fa", [("e", "")])])
    assert c.lengths.tolist() == [0]
    with pytest.raises(ValueError):
        c.sample_windows(1, 1, torch.Generator())


@pytest.mark.skipif(not PHIX.exists(), reason="shared data not present")
def test_real_phix174() -> None:
    c = Corpus.from_paths([PHIX])
    assert [r.name for r in c.records] == ["NC_001422.1"] and c.lengths.tolist() == [5386]
    assert set(np.unique(c.records[0].seq).tolist()) <= {65, 67, 71, 84}
    assert bytes(c.records[0].seq[:20]).decode() == "GAGTTTTATCGCTTCCATGA"
    gc = float(np.isin(c.records[0].seq, [67, 71]).mean())
    assert abs(gc - 0.448) < 0.001  # README: GC 44.8 %
    w = c.sample_windows(8, 512, torch.Generator().manual_seed(0))
    assert w.shape == (8, 513)
    assert sum(len(ids) - s for ids, s in iter_eval_windows(c.records[0].seq, 1024, 256)) == 5385
    # the directory form reads the same file among the split
    assert "NC_001422.1" in [r.name for r in Corpus.from_paths(PHIX.parent).records]
