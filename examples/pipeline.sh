#!/usr/bin/env bash
# A region of a genome, continued by EvSpark, in the middle of an ordinary shell pipeline:
#
#   extract REGION (samtools faidx, else Python)  |  evspark generate -  |  bgzip/gzip  >  OUT
#
# usage: examples/pipeline.sh [GENOME.fa[.gz]] [REGION] [OUT.fa.gz] [extra evspark options...]
#   e.g. examples/pipeline.sh examples/prompts.fa P05:1-100 p05.fa.gz -n 256 --temperature 0.8
#
# REGION is samtools syntax: ID, ID:START-END, ID:START, ID:-END, with commas allowed in the
# numbers (chr1:1,000,001-1,008,192) and {ID} for a record whose name looks like a range.
# Environment: EVSPARK_MODEL (a model folder; default: the bundled target), N (new tokens,
# default 256), SEED (default 0), EVSPARK (the command, default `evspark`; e.g.
# "python -m evspark_cli.cli"), PYTHON (for the fallback extractor, default python3).
#
# The record that reaches evspark is named the way `evspark generate --region` names a region
# (ID:START-END with the end filled in and no commas, or ID), and evspark keys its random
# numbers by that name, so the result is byte-identical to
# `evspark generate GENOME --region REGION --seed SEED -n N`.
set -euo pipefail

usage="usage: examples/pipeline.sh [GENOME.fa[.gz]] [REGION] [OUT.fa.gz] [evspark options...]"
if [[ ${1:-} == -h || ${1:-} == --help ]]; then echo "$usage"; exit 0; fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
genome=${1:-$here/prompts.fa}  # the bundled example prompts, from any folder
region=${2:-P05:1-100}
out=${3:-continuation.fa.gz}
shift $(( $# < 3 ? $# : 3 ))
if [[ ! -f $genome || ! -r $genome ]]; then
    echo "pipeline.sh: error: $genome: no such readable file ($usage)" >&2
    exit 2
fi

EVSPARK=${EVSPARK:-evspark}
PYTHON=${PYTHON:-python3}
model=()
if [[ -n "${EVSPARK_MODEL:-}" ]]; then model=(--model "$EVSPARK_MODEL"); fi

# commas in the numbers mean nothing (samtools ignores them too)
[[ $region == *:* ]] && region="${region%:*}:$(tr -d , <<< "${region##*:}")"

# samtools' reading of REGION: a record of that exact name, else {ID}:COORDS or ID:COORDS
name=$region
start=""
if [[ $region =~ ^\{(.+)\}(:([0-9]*)(-[0-9]*)?)?$ ]]; then
    name=${BASH_REMATCH[1]}
    [[ -n ${BASH_REMATCH[2]} ]] && start=${BASH_REMATCH[3]:-1}
elif [[ $region =~ ^(.+):([0-9]*)(-[0-9]*)?$ && -n ${BASH_REMATCH[2]}${BASH_REMATCH[3]} ]]; then
    name=${BASH_REMATCH[1]}
    start=${BASH_REMATCH[2]:-1}
fi

extract() {
    # samtools needs a plain or bgzipped genome; anything else goes through Biopython
    if command -v samtools >/dev/null 2>&1 && samtools faidx "$genome" "$region" 2>/dev/null \
            > "$tmp"; then
        if [[ $region != \{* ]] && cut -f1 "$genome.fai" 2>/dev/null | grep -qxF -- "$region"; then
            name=$region start=""  # a record whose name looks like a range: samtools took it whole
        fi
        rename < "$tmp"
        return
    fi
    "$PYTHON" - "$genome" "$region" <<'PY'
import gzip, re, sys
from Bio.SeqIO.FastaIO import SimpleFastaParser

path, region = sys.argv[1:3]
with open(path, "rb") as f:
    gz = f.read(2) == b"\x1f\x8b"
with (gzip.open(path, "rt") if gz else open(path)) as f:
    records = {t.split(None, 1)[0]: s for t, s in SimpleFastaParser(f)}
m = re.fullmatch(r"\{(.+)\}(?::(\d*)(?:-(\d*))?)?|(.+?):(\d*)(?:-(\d*))?", region)
braced = m is not None and m.group(1) is not None
ranged = m is not None and (braced and ":" in region[len(m.group(1)) + 2:] or
                            not braced and (m.group(5) or m.group(6)))
name = (m.group(1) if braced else m.group(4)) if ranged or braced else region
if not braced and region in records:
    if ranged and name in records:
        sys.exit(f"pipeline.sh: region {region!r} is ambiguous; use {{{region}}} or "
                 f"{{{name}}}:{region[len(name) + 1:]}")
    name, ranged = region, False
seq = records.get(name)
if seq is None:
    sys.exit(f"pipeline.sh: no record {name!r} in {path}")
if ranged:
    first, last = (m.group(2), m.group(3)) if braced else (m.group(5), m.group(6))
    start, end = int(first or 1), int(last) if last else len(seq)
    if not 1 <= start <= end <= len(seq):
        sys.exit(f"pipeline.sh: region {region} is outside {name} ({len(seq)} bp)")
    print(f">{name}:{start}-{end}")
    print(seq[start - 1:end])
else:
    print(f">{name}")
    print(seq)
PY
}

rename() {
    # the one record named ID:START-END (START..START+length-1) or ID, as evspark names regions
    awk -v name="$name" -v start="$start" '
        NR > 1 { seq = seq $0 "\n"; n += length($0) }
        END {
            if (NR == 0) exit 1
            print (start == "" ? ">" name : ">" name ":" start "-" (start + n - 1))
            printf "%s", seq
        }'
}

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

compress() {
    if command -v bgzip >/dev/null 2>&1; then bgzip -c; else gzip -c; fi
}

# shellcheck disable=SC2086  # $EVSPARK may be a command with arguments
extract \
    | $EVSPARK generate - ${model[@]+"${model[@]}"} -n "${N:-256}" --seed "${SEED:-0}" \
        --quiet "$@" \
    | compress > "$out"

echo "pipeline.sh: wrote $out" >&2
