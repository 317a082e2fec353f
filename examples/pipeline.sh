#!/usr/bin/env bash
# A region of a genome, continued by EvSpark, in the middle of an ordinary shell pipeline:
#
#   extract REGION (samtools faidx, else Python)  |  evspark generate -  |  bgzip/gzip  >  OUT
#
# usage: examples/pipeline.sh [GENOME.fa[.gz]] [REGION] [OUT.fa.gz] [extra evspark options...]
#   e.g. examples/pipeline.sh examples/prompts.fa P05:1-100 p05.fa.gz -n 256 --temperature 0.8
#
# Environment: EVSPARK_MODEL (a model folder; default: the bundled target), N (new tokens,
# default 256), EVSPARK (the command, default `evspark`; e.g. "python -m evspark_cli.cli"),
# PYTHON (for the fallback extractor, default python3).
# The record that reaches evspark is named like the region (samtools style, e.g. P05:1-100),
# so the result is identical to `evspark generate GENOME --region REGION` with the same seed.
set -euo pipefail

genome=${1:-examples/prompts.fa}
region=${2:-P05:1-100}
out=${3:-continuation.fa.gz}
shift $(( $# < 3 ? $# : 3 ))

EVSPARK=${EVSPARK:-evspark}
PYTHON=${PYTHON:-python3}
model=()
if [[ -n "${EVSPARK_MODEL:-}" ]]; then model=(--model "$EVSPARK_MODEL"); fi

extract() {
    # samtools needs a plain or bgzipped genome; anything else goes through Biopython
    if command -v samtools >/dev/null 2>&1 && samtools faidx "$genome" "$region" 2>/dev/null; then
        return
    fi
    "$PYTHON" - "$genome" "$region" <<'PY'
import gzip, re, sys
from Bio.SeqIO.FastaIO import SimpleFastaParser

path, region = sys.argv[1], sys.argv[2]
m = re.fullmatch(r"(.+?)(?::([\d,]+)(?:-([\d,]+))?)?", region)
name = m.group(1)
with open(path, "rb") as f:
    gz = f.read(2) == b"\x1f\x8b"
with (gzip.open(path, "rt") if gz else open(path)) as f:
    seq = next((s for t, s in SimpleFastaParser(f) if t.split(None, 1)[0] == name), None)
if seq is None:
    sys.exit(f"pipeline.sh: no record {name!r} in {path}")
start = int(m.group(2).replace(",", "")) if m.group(2) else 1
end = int(m.group(3).replace(",", "")) if m.group(3) else len(seq)
if not 1 <= start <= end <= len(seq):
    sys.exit(f"pipeline.sh: region {region} is outside {name} ({len(seq)} bp)")
sub = seq[start - 1:end]
print(f">{name}:{start}-{end}" if m.group(2) else f">{name}")
for i in range(0, len(sub), 60):
    print(sub[i:i + 60])
PY
}

compress() {
    if command -v bgzip >/dev/null 2>&1; then bgzip -c; else gzip -c; fi
}

# shellcheck disable=SC2086  # $EVSPARK may be a command with arguments
extract \
    | $EVSPARK generate - ${model[@]+"${model[@]}"} -n "${N:-256}" --seed 0 --quiet "$@" \
    | compress > "$out"

echo "pipeline.sh: wrote $out" >&2
