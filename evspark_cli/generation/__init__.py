"""A generation run, from settings to written records: what `generate`, `verify`, `bench`, the
Python API (and a server) drive.

- `options`: `DecodeOptions`, each value checked once, and the rules that follow from it (the
  largest useful draft, a row's KV reserve, the default batch).
- `records`: output ids and FASTA headers (`RecordScheme`).
- `jobs`: the one job builder (`build_jobs`) and the random-number key of a record.
- `plan`: the model and drafter checked against the run; the batch size that fits in memory.
- `run`: `GenerationRun`, jobs through the batched decoder, outcomes in input order.
- `results`: a job's output and its stats row.
- `outputs`: the FASTA and stats files, resumed ones checked, written in order.
"""
