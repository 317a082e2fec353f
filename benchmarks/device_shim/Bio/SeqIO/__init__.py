from types import SimpleNamespace
from .FastaIO import SimpleFastaParser


def parse(handle, fmt):
    assert fmt == "fasta"
    for title, seq in SimpleFastaParser(handle):
        yield SimpleNamespace(id=title.split()[0] if title else "", description=title, seq=seq)
