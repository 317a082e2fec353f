"""A stand-in for the two biopython entry points EvSpark calls (`SeqIO.parse` for FASTA and
`SeqIO.FastaIO.SimpleFastaParser`), for a GPU machine where biopython is not installed and
cannot be fetched. Used only by benchmarks/gpu_cli_smoke.sh; never imported by the package."""
