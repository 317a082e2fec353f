"""The `evspark` command line (contract: design/cli.md).

Heavy modules (torch, the engine) are imported inside the commands so `evspark --help` stays fast.
Every failure becomes one `evspark: error: ...` line and a documented exit code; set
EVSPARK_DEBUG=1 for a traceback.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import shutil
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import typer

if TYPE_CHECKING:  # the CLI imports its I/O lazily (a fast --help)
    from .io.writers import FastaOutput

app = typer.Typer(
    name="evspark",
    help="Lossless speculative decoding for StripedHyena 2 (Evo 2-style) DNA language models.\n\n"
         "Generate DNA several times faster with exactly the model's own output distribution.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# ------------------------------------------------------------------------------- error handling


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fail(msg: str, code: int) -> None:
    _say(f"evspark: error: {msg}")
    raise typer.Exit(code)


def handle_errors(fn: Callable) -> Callable:
    """Turn EvSpark errors (and anything unexpected) into one line and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from .errors import EvsparkError

        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except EvsparkError as e:
            if os.environ.get("EVSPARK_DEBUG"):
                traceback.print_exc()
            fail(str(e).splitlines()[0] if str(e) else type(e).__name__, e.exit_code)
        except BrokenPipeError:
            # `evspark generate ... | head`: the reader went away; stop quietly like other tools
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(141)
        except KeyboardInterrupt:
            _say("evspark: interrupted; finished records are kept in the .partial files "
                 "(rerun with --resume)")
            raise typer.Exit(130)
        except MemoryError:
            fail("out of memory (try a shorter --prompt-tail or fewer tokens)", 1)
        except Exception as e:  # noqa: BLE001 - never a traceback for users
            if os.environ.get("EVSPARK_DEBUG"):
                traceback.print_exc()
            fail(f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                 "(set EVSPARK_DEBUG=1 for a traceback)", 1)

    return wrapper


# ------------------------------------------------------------------------------- shared options

ModelOpt = typer.Option(None, "--model", help="Model folder (config.json + model.safetensors). "
                        "Default: the bundled target.")
RegionOpt = typer.Option(None, "--region", help="samtools-style region ID:START-END (1-based, "
                         "inclusive) or ID; repeatable. Read through pyfaidx.")
TailOpt = typer.Option(None, "--prompt-tail", help="Use only the last N bases of each record.")
ShardOpt = typer.Option(None, "--shard", help="I/N: process only records i with i mod N == I-1 "
                        "(N jobs cover the input exactly once).")
DeviceOpt = typer.Option("auto", "--device", help="auto, cpu or cuda.")
DtypeOpt = typer.Option("auto", "--dtype", help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16.")
CompileOpt = typer.Option(False, "--compile", help="On a CPU, run decode steps and verification "
                          "blocks through torch.compile (needs a C++ compiler; a block length "
                          "compiles at its 32nd use: ~20 s the first time on a machine, ~1.5-4 s once "
                          "torch's on-disk cache holds it; then ~1.2x faster native decoding; "
                          "same tokens).")
GraphsOpt = typer.Option(True, "--cuda-graphs/--no-cuda-graphs", help="On a GPU, replay decode "
                         "steps and verification blocks from CUDA graphs (no effect on CPU).")
QuietOpt = typer.Option(False, "--quiet", "-q", help="No progress bar.")
ThreadsOpt = typer.Option(0, "--threads", help="CPU threads for torch (0 = torch's default).")


def _setup_torch(threads: int) -> None:
    import torch

    if threads < 0:
        from .errors import InputError

        raise InputError(f"--threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)


def _load_prompts(inputs: list[str], region: list[str] | None, prompt_tail: int | None,
                  shard: str | None):
    from .io.fasta import read_prompts
    from .io.shard import parse_shard, select_shard

    shard_t = parse_shard(shard) if shard else None
    prompts = read_prompts(inputs or [], region or None, prompt_tail)
    if not prompts:
        from .errors import InputError

        raise InputError("no input records")
    return select_shard(prompts, shard_t)


def _check_distinct_outputs(inputs: list[str] | None, outputs: list[tuple[str, str | None]]) -> None:
    """Outputs must not be an input (it would be overwritten) nor each other."""
    from .errors import InputError

    def key(path: str) -> str:
        return os.path.realpath(path)

    seen: dict[str, str] = {}
    ins = {key(p): p for p in (inputs or []) if p != "-" and os.path.exists(p)}
    for opt, path in outputs:
        if not path or path == "-":
            continue
        k = key(path)
        if k in ins:
            raise InputError(f"{opt} {path} is also an input; it would be overwritten")
        if k in seen:
            raise InputError(f"{opt} and {seen[k]} name the same file {path}")
        seen[k] = opt


def _record_key(record_id: str) -> int:
    """A stable RNG key per record id: output does not depend on record order or sharding."""
    return int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:7], "big")


def _check_context(model, prompts, new_tokens: int) -> None:
    from .errors import InputError

    limit = model.config.max_seqlen
    for p in prompts:
        if len(p.seq) + new_tokens > limit:
            raise InputError(f"record '{p.id}': prompt of {len(p.seq)} bases + {new_tokens} new tokens "
                             f"exceeds the model's context of {limit}; use --prompt-tail N")


def _progress(total: int, quiet: bool, label: str):
    """A rich progress bar on stderr when it is a terminal, else a no-op."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    enabled = not quiet and console.is_terminal
    prog = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    TextColumn("{task.fields[note]}"), console=console, disable=not enabled,
                    transient=False)
    return prog


def fasta_letters(text: str) -> str:
    """Generated tokens as FASTA letters: anything that is not a letter (a model can emit any of
    its 512 ids) is written as N, so the output always parses."""
    return "".join(c if ("A" <= c <= "Z" or "a" <= c <= "z") else "N" for c in text)


def _validate_decode_options(n: int, gamma: int, temperature: float, top_k: int, top_p: float,
                             samples: int, rollback: str, line_width: int, seed: int = 0):
    from .decode.sampling import SamplerConfig
    from .errors import InputError

    if not 0 <= seed < 2 ** 63:
        raise InputError(f"--seed must be in [0, 2**63), got {seed}")
    if n < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {n}")
    if gamma < 1:
        raise InputError(f"--gamma must be >= 1, got {gamma}")
    if samples < 1:
        raise InputError(f"--samples must be >= 1, got {samples}")
    if rollback not in ("slice", "replay"):
        raise InputError(f"--rollback must be slice or replay, got {rollback!r}")
    if line_width < 0:
        raise InputError(f"--line-width must be >= 0, got {line_width}")
    cfg = SamplerConfig(temperature, top_k, top_p)
    cfg.validate()
    return cfg


# ------------------------------------------------------------------------------------ generate


@app.command()
@handle_errors
def generate(
    inputs: List[str] = typer.Argument(..., metavar="INPUT...", help="FASTA files (plain, gzip, "
                                       "BGZF); '-' reads FASTA from stdin."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="FASTA of generated "
                                         "sequences (default stdout); written atomically."),
    stats: Optional[str] = typer.Option(None, "--stats", help="Per-record statistics, .tsv or .jsonl."),
    model_dir: Optional[str] = ModelOpt,
    drafter: str = typer.Option("auto", "--drafter", help="auto (the model's bundled drafter), "
                                "dspark, kmer, identity, none (native decoding) or a drafter folder."),
    gamma: int = typer.Option(12, "--gamma", "-g", help="Draft length per round."),
    max_new_tokens: int = typer.Option(1024, "-n", "--max-new-tokens", help="Tokens per record."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature (0 = greedy)."),
    top_k: int = typer.Option(4, "--top-k", help="Keep the k most likely tokens (1 = greedy, 0 = all)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling inside the kept tokens."),
    greedy: bool = typer.Option(False, "--greedy", help="Same as --top-k 1."),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed reproduces a run."),
    samples: int = typer.Option(1, "--samples", help="Continuations per record (ids get _s{i})."),
    compare_native: bool = typer.Option(False, "--compare-native", help="Also decode natively in "
                                        "the same process and report the speedup."),
    rollback: str = typer.Option("slice", "--rollback", help="slice (per-position state) or replay "
                                 "(snapshot-and-replay baseline)."),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    cuda_graphs: bool = GraphsOpt,
    compile_cpu: bool = CompileOpt,
    line_width: int = typer.Option(60, "--line-width", help="FASTA line width (0 = one line)."),
    include_prompt: bool = typer.Option(False, "--include-prompt", help="Prepend the prompt."),
    region: Optional[List[str]] = RegionOpt,
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run from OUTPUT.partial."),
    force_drafter: bool = typer.Option(False, "--force-drafter", help="Use a drafter distilled from "
                                       "another target anyway."),
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Continue each record (or region) and write the continuations as FASTA."""
    from .io.writers import check_output_path

    if greedy:
        top_k = 1
    sampler = _validate_decode_options(max_new_tokens, gamma, temperature, top_k, top_p, samples,
                                       rollback, line_width, seed)
    check_output_path(output)
    if stats:
        check_output_path(stats)
    _check_distinct_outputs(inputs, [("--output", output), ("--stats", stats)])
    prompts = _load_prompts(inputs, region, prompt_tail, shard)
    _setup_torch(threads)
    from .api import STATS_COLUMNS, check_gamma, drafter_name, generate as gen, resolve_drafter
    from .errors import InputError
    from .io.writers import FastaOutput, StatsOutput
    from .model.checkpoint import load_model

    model = load_model(model_dir, device=device, dtype=dtype, cuda_graphs=cuda_graphs,
                       compile=compile_cpu)
    _check_context(model, prompts, max_new_tokens)
    d = resolve_drafter(model, drafter, force=force_drafter)
    check_gamma(d, min(gamma, max_new_tokens - 1))  # rounds never draft more
    model_name = model.config.model_name
    if stats and not stats.endswith((".tsv", ".jsonl")):
        raise InputError(f"--stats {stats}: use a .tsv or .jsonl file name")
    settings = {"model": model_name, "drafter": drafter_name(d), "gamma": str(gamma),
                "temperature": f"{sampler.temperature:g}", "top_k": str(sampler.top_k),
                "top_p": f"{sampler.top_p:g}", "seed": str(seed)}
    fasta = FastaOutput(output, line_width=line_width, resume=resume)
    try:
        _check_resumed_settings(fasta, dict(settings, new_tokens=str(max_new_tokens)))
        stat_out = StatsOutput(stats, STATS_COLUMNS, resume=resume) if stats else None
    except BaseException:
        # a resumed FASTA made with other settings, or a stats file that cannot be opened (e.g.
        # a stale .partial): do not leave a FASTA partial of a run that never started behind
        fasta.close()
        if fasta.partial and not fasta.done_ids and not resume:
            with contextlib.suppress(OSError):
                os.remove(fasta.partial)
        raise
    jobs = [(p, s) for p in prompts for s in range(samples)]
    failed: list[str] = []
    # both files are closed on any exit (an interrupt included): a leaked descriptor would keep
    # its lock and make an in-process --resume fail with "another process is writing it"
    with fasta, (stat_out if stat_out is not None else contextlib.nullcontext()):
        prog = _progress(len(jobs), quiet, "generate")
        with prog:
            task = prog.add_task("generate", total=len(jobs), note="")
            for p, s in jobs:
                rid = f"{p.id}_s{s}" if samples > 1 else p.id
                if rid in fasta.done_ids:
                    prog.advance(task)
                    continue
                try:
                    out = gen(model, p.seq, max_new_tokens, drafter=d, gamma=gamma,
                              temperature=sampler.temperature, top_k=sampler.top_k,
                              top_p=sampler.top_p, seed=seed, rollback=rollback,
                              record=_record_key(p.id), sample=s, record_id=rid,
                              compare_native=compare_native)
                except Exception as e:  # noqa: BLE001 - one bad record must not sink the rest
                    if os.environ.get("EVSPARK_DEBUG"):
                        traceback.print_exc()
                    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                    _say(f"evspark: error: record '{rid}' failed: {msg}")
                    failed.append(rid)
                    prog.advance(task)
                    continue
                desc = " ".join(["evspark", *(f"{k}={v}" for k, v in settings.items()),
                                 f"new_tokens={len(out.tokens)}"])
                text = fasta_letters(out.text)
                seq = (p.seq + text) if include_prompt else text
                # stats row first: a record counts as done once it is in the FASTA, so an
                # interrupt between the two writes must not leave a done record without its row
                # (a row without its record is kept and not written twice on --resume)
                if stat_out is not None and rid not in stat_out.done_ids:
                    stat_out.write(out.stats)
                fasta.write(rid, desc, seq)
                tau = out.stats.get("tau")
                prog.update(task, advance=1, note=f"tau={tau:.2f}" if tau else "")
        if failed:
            if stat_out is not None:
                stat_out.close()
            fail(f"{len(failed)} of {len(jobs)} records failed ({', '.join(failed[:5])}); the "
                 f"others are kept in the .partial files; rerun with --resume", 1)
        fasta.finish()
        if stat_out is not None:
            stat_out.finish()


def _check_resumed_settings(fasta: "FastaOutput", want: dict[str, str]) -> None:
    """Refuse to --resume a FASTA whose finished records were made with other settings (their
    headers record them): the final file would mix two runs."""
    from .errors import InputError

    for rid, desc in fasta.done_descriptions.items():
        words = desc.split()
        if not words or words[0] != "evspark":  # not a header this tool wrote: nothing to compare
            continue
        got = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        for key, value in want.items():
            if key in got and got[key] != value:
                raise InputError(f"--resume: {fasta.partial} has record '{rid}' made with "
                                 f"{key}={got[key]}, this run has {key}={value}; rerun with the "
                                 "same options or delete the .partial")


# -------------------------------------------------------------------------------------- verify


def _default_verify_inputs() -> list[str]:
    here = Path(__file__).resolve().parents[1] / "examples" / "prompts.fa"
    return [str(here)]


@app.command()
@handle_errors
def verify(
    inputs: Optional[List[str]] = typer.Argument(None, metavar="[INPUT...]", help="FASTA prompts "
                                                 "(default: the bundled example prompts)."),
    model_dir: Optional[str] = ModelOpt,
    drafter: str = typer.Option("auto", "--drafter", help="Drafter to check (auto, dspark, kmer, "
                                "identity or a folder)."),
    gamma: int = typer.Option(12, "--gamma", "-g", help="Draft length per round."),
    max_new_tokens: int = typer.Option(256, "-n", "--max-new-tokens", help="Tokens per prompt."),
    region: Optional[List[str]] = RegionOpt,
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    rollback: str = typer.Option("slice", "--rollback", help="slice or replay."),
    report: Optional[str] = typer.Option(None, "--report", help="Write a JSON report here."),
    tie_tolerance: Optional[float] = typer.Option(
        None, "--tie-tolerance", help="A divergence is a tie when the native top-1/top-2 logit "
        "gap there is below this. Default: 1e-3 for fp32 weights, 0.1 for bf16 (whose logits "
        "a step and a block round differently)."),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    cuda_graphs: bool = GraphsOpt,
    compile_cpu: bool = CompileOpt,
    force_drafter: bool = typer.Option(False, "--force-drafter", help="Allow a mismatched drafter."),
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Greedy native vs greedy speculative decoding, compared token by token (exit 1 on a
    non-tie divergence)."""
    import json

    from .decode.sampling import SamplerConfig
    from .errors import InputError
    from .io.writers import check_output_path

    _validate_decode_options(max_new_tokens, gamma, 1.0, 1, 1.0, 1, rollback, 0)
    if tie_tolerance is not None and tie_tolerance < 0:
        raise InputError(f"--tie-tolerance must be >= 0, got {tie_tolerance}")
    if report:
        check_output_path(report)
        _check_distinct_outputs(inputs, [("--report", report)])
    prompts = _load_prompts(inputs or _default_verify_inputs(), region, prompt_tail, shard)
    _setup_torch(threads)
    from .api import check_gamma, drafter_name, resolve_drafter
    from .decode.drafters.base import RngKey
    from .decode.native import decode_native
    from .decode.speculative import decode_speculative
    from .eval.compare import compare_greedy, default_tie_tolerance
    from .model.checkpoint import load_model

    model = load_model(model_dir, device=device, dtype=dtype, cuda_graphs=cuda_graphs,
                       compile=compile_cpu)
    _check_context(model, prompts, max_new_tokens)
    d = resolve_drafter(model, drafter, force=force_drafter)
    check_gamma(d, min(gamma, max_new_tokens - 1))
    if d is None:
        raise InputError("verify needs a drafter (not 'none')")
    if tie_tolerance is None:
        tie_tolerance = default_tie_tolerance(next(model.parameters()).dtype)
    greedy = SamplerConfig(1.0, 1, 1.0)
    rows = []
    prog = _progress(len(prompts), quiet, "verify")
    with prog:
        task = prog.add_task("verify", total=len(prompts), note="")
        for p in prompts:
            ids = list(p.seq.encode())
            rng = RngKey(0, _record_key(p.id), 0)
            nat = decode_native(model, ids, max_new_tokens, greedy, rng, p.id, track_margins=True)
            spec = decode_speculative(model, ids, max_new_tokens, greedy, d, gamma, rng, rollback,
                                      p.id)
            row = compare_greedy(p.id, nat, spec, tie_tolerance)
            rows.append(row)
            prog.advance(task)
    bad = [r for r in rows if r["divergence"] is not None and not r["tie"]]
    w = max([24] + [len(r["record_id"]) for r in rows])  # whole ids: they name the records
    print(f"{'record':<{w}} {'compared':>8} {'first_divergence':>16} {'tie':>5} {'tau':>6} {'speedup':>7}")
    for r in rows:
        div = "-" if r["divergence"] is None else str(r["divergence"])
        tie = "-" if r["divergence"] is None else ("yes" if r["tie"] else "NO")
        print(f"{r['record_id']:<{w}} {r['compared']:>8} {div:>16} {tie:>5} "
              f"{r['tau']:>6.2f} {r['speedup']:>7.2f}")
    ties = sum(1 for r in rows if r["divergence"] is not None and r["tie"])
    print(f"drafter={drafter_name(d)} gamma={gamma} prompts={len(rows)} identical="
          f"{sum(1 for r in rows if r['divergence'] is None)} ties={ties} non_tie_divergences={len(bad)}")
    if report:
        _atomic_write(report, json.dumps({"drafter": drafter_name(d), "gamma": gamma,
                                          "tie_tolerance": tie_tolerance, "rows": rows}, indent=1))
    if bad:
        raise typer.Exit(1)


# --------------------------------------------------------------------------------------- score


@app.command()
@handle_errors
def score(
    inputs: List[str] = typer.Argument(..., metavar="INPUT...", help="FASTA files or '-'."),
    model_dir: Optional[str] = ModelOpt,
    output: Optional[str] = typer.Option(None, "-o", "--output", help="TSV (default stdout)."),
    logits: Optional[str] = typer.Option(None, "--logits", help="Also save fp32 logits of every "
                                         "position (.safetensors, one tensor per record)."),
    context: int = typer.Option(8192, "--context", help="Each scored base sees at least this many "
                                "preceding bases (where the record has them)."),
    window: int = typer.Option(8192, "--window", help="Bases scored per forward pass."),
    region: Optional[List[str]] = RegionOpt,
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run from "
                                "OUTPUT.partial (records already scored there are kept)."),
) -> None:
    """Teacher-forced log-likelihood per record: record_id, length, bits_per_nt.

    Rows are written as records finish, to OUTPUT.partial (renamed when every record is done):
    a record that fails is reported and skipped, and the others stay for `--resume`."""
    from .errors import InputError
    from .io.writers import StatsOutput, check_output_path

    if context < 1 or window < 1:
        raise InputError("--context and --window must be >= 1")
    for path in (output, logits):
        check_output_path(path)
    _check_distinct_outputs(inputs, [("--output", output), ("--logits", logits)])
    prompts = _load_prompts(inputs, region, prompt_tail, shard)
    _setup_torch(threads)
    import torch

    from .eval.score import score_sequence
    from .model.checkpoint import load_model
    from .model.tokenizer import tokenize_tensor

    model = load_model(model_dir, device=device, dtype=dtype)
    fmt = "jsonl" if output and output.lower().endswith(".jsonl") else "tsv"
    saved: dict[str, torch.Tensor] = {}
    failed: list[str] = []
    with StatsOutput(output, SCORE_COLUMNS, resume=resume, fmt=fmt) as rows:
        prog = _progress(len(prompts), quiet, "score")
        with prog:
            task = prog.add_task("score", total=len(prompts), note="")
            for p in prompts:
                done = p.id in rows.done_ids
                if done and not logits:  # resumed: its row is in the partial already
                    prog.advance(task)
                    continue
                try:  # a resumed record is scored again only for its logits
                    bpn, lg = score_sequence(model, tokenize_tensor(p.seq), context, window,
                                             keep_logits=bool(logits))
                except Exception as e:  # noqa: BLE001 - one bad record must not sink the rest
                    if os.environ.get("EVSPARK_DEBUG"):
                        traceback.print_exc()
                    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                    _say(f"evspark: error: record '{p.id}' failed: {msg}")
                    failed.append(p.id)
                    prog.advance(task)
                    continue
                if not done:
                    rows.write({"record_id": p.id, "length": len(p.seq),
                                "bits_per_nt": round(bpn, 4)})
                if logits and lg is not None:
                    saved[p.id] = lg
                prog.advance(task)
        if failed:
            rows.close()
            kept = f"kept in {rows.partial}; rerun with --resume" if rows.partial else "printed"
            fail(f"{len(failed)} of {len(prompts)} records failed ({', '.join(failed[:5])}); "
                 f"the others are {kept}", 1)
        if logits:
            from safetensors.torch import save_file

            tmp = logits + ".tmp"
            save_file({k: v.contiguous() for k, v in saved.items()}, tmp)
            os.replace(tmp, logits)
        rows.finish()


SCORE_COLUMNS = ("record_id", "length", "bits_per_nt")


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------ convert / info


@app.command()
@handle_errors
def convert(
    checkpoint: str = typer.Argument(..., help="Evo 2 / vortex checkpoint (.pt or .safetensors)."),
    config: str = typer.Option(..., "--config", help="Its config (.yml or .json, Evo 2 field names)."),
    out: str = typer.Option(..., "-o", "--output", help="Output model folder."),
) -> None:
    """Convert an Evo 2 / vortex checkpoint into an EvSpark model folder."""
    from .model.checkpoint import convert_checkpoint

    folder = convert_checkpoint(checkpoint, config, out)
    _say(f"evspark: wrote {folder}")


@app.command()
@handle_errors
def info(model_dir: Optional[str] = ModelOpt) -> None:
    """Architecture, parameters, layer pattern, state size and training summary of a model."""
    from .model.checkpoint import load_model, model_card_summary

    model = load_model(model_dir, device="cpu")
    cfg = model.config
    st = model.empty_state(1, capacity=1).nbytes()
    pattern = model.layer_kinds()
    counts = {k: pattern.count(k) for k in ("hcs", "hcm", "hcl", "attn")}
    print(f"model          {cfg.model_name}  ({model.source_dir or ''})")
    print(f"parameters     {model.num_parameters():,}")
    print(f"hidden         {cfg.hidden_size}  layers {cfg.num_layers}  heads {cfg.num_attention_heads}"
          f"  mlp {cfg.mlp_size}")
    print(f"layer pattern  {' '.join(pattern)}")
    print(f"blocks         SE {counts['hcs']}  MR {counts['hcm']}  LI {counts['hcl']}  attention {counts['attn']}")
    print(f"filters        SE {cfg.hcs_filter_length} taps/{cfg.hcs_filter_groups} groups, MR "
          f"{cfg.hcm_filter_length} taps/{cfg.hcm_filter_groups} groups, LI {cfg.state_size} modes")
    print(f"context        {cfg.max_seqlen:,} tokens (RoPE base {cfg.rotary_emb_base:g}, scale {cfg.rope_scale:g})")
    print(f"state          {st['fixed']:,} bytes per sequence + {st['kv_per_token']:,} bytes per token")
    print(f"drafter layers {cfg.drafter_layers}")
    card = model_card_summary(model.source_dir) if model.source_dir is not None else None
    if card:
        summary = [ln for ln in card.splitlines() if ln.startswith(("- **", "**"))][:8]
        if summary:
            print("training       " + "\n               ".join(s.strip("- ") for s in summary))


# ---------------------------------------------------------------------------------- train


@app.command()
@handle_errors
def train(
    config: str = typer.Option(..., "--config", help="train_config.json of the run (see "
                               "models/*/MODEL_CARD.md for the bundled recipe)."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from RUN/ckpt.pt if present."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Override the total number of steps "
                                        "(the length of the cosine schedule)."),
    stop_at: Optional[int] = typer.Option(None, "--stop-at", help="Checkpoint and stop at this step "
                                          "(to replay a run whose budget changed on the way)."),
    export_only: bool = typer.Option(False, "--export-only", help="Only export the last checkpoint "
                                     "as a model folder."),
    export: Optional[str] = typer.Option(None, "--export", help="Model folder to export to "
                                         "(default RUN/model)."),
    quiet: bool = QuietOpt,
) -> None:
    """Pretrain a StripedHyena 2 target on FASTA genomes (resumable, logged, deterministic)."""
    from .errors import InputError
    from .train.pretrain import Trainer, load_train_config

    if not Path(config).is_file():
        raise InputError(f"no such train config: {config}")
    cfg = load_train_config(config)
    if steps is not None:
        if steps < 1:
            raise InputError(f"--steps must be >= 1, got {steps}")
        cfg.steps = steps
    if stop_at is not None and stop_at < 1:
        raise InputError(f"--stop-at must be >= 1, got {stop_at}")
    if export is not None and Path(export).exists() and not Path(export).is_dir():
        raise InputError(f"--export {export} is a file, not a model folder")
    trainer = Trainer(cfg)
    resumed = trainer.resume() if resume else False
    if resumed:
        _say(f"evspark: resumed {cfg.out_dir} at step {trainer.step}")
    elif export_only:
        raise InputError(f"--export-only: no checkpoint {trainer.ckpt_path} to export"
                         + (" (without --no-resume)" if not resume else ""))
    if not export_only:
        prog = _progress(cfg.steps, quiet, "train")
        with prog:
            task = prog.add_task("train", total=cfg.steps, completed=trainer.step, note="")

            def cb(step: int, total: int, loss: float) -> None:
                prog.update(task, completed=step, note=f"loss={loss:.3f}")

            try:
                trainer.run(cb, stop_at=stop_at)
            except KeyboardInterrupt:
                _say(f"evspark: interrupted; rerun the same command to resume from "
                     f"{trainer.ckpt_path} (step {_ckpt_step(trainer.ckpt_path)})")
                raise typer.Exit(130) from None
    folder = trainer.export(export)
    _say(f"evspark: exported {folder} (step {trainer.step}, {trainer.tokens_seen:,} tokens)")


def _ckpt_step(path: Path) -> int:
    """The step a run checkpoint holds (0 when there is none or it cannot be read)."""
    import torch

    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["step"])
    except Exception:  # noqa: BLE001 - only for a message
        return 0


@app.command()
@handle_errors
def distill(
    model_dir: Optional[str] = ModelOpt,
    train_data: Optional[List[str]] = typer.Option(None, "--train", help="Training FASTA files or "
                                                    "folders for the teacher cache."),
    cache: Optional[str] = typer.Option(None, "--cache", help="Teacher-cache folder (built here if "
                                        "it has no index.json)."),
    out: Optional[str] = typer.Option(None, "-o", "--output", help="Drafter folder to write "
                                      "(default MODEL/drafters/seed{SEED})."),
    seed: int = typer.Option(0, "--seed", help="Drafter training seed."),
    steps: int = typer.Option(3000, "--steps", help="Training steps."),
    batch: int = typer.Option(64, "--batch", help="Anchors per step."),
    gamma: int = typer.Option(12, "--gamma", help="Draft positions supervised per anchor."),
    natural_windows: int = typer.Option(384, "--natural-windows", help="Natural windows in the cache."),
    onpolicy_windows: int = typer.Option(192, "--onpolicy-windows", help="Target-generated windows."),
    window: int = typer.Option(1024, "--window", help="Tokens per cached window."),
    width: int = typer.Option(128, "--width", help="Drafter trunk width."),
    layers: int = typer.Option(2, "--layers", help="Drafter trunk layers."),
    prefix: int = typer.Option(64, "--prefix", help="Hidden-state prefix length P."),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="Checkpoints and log (resumable; "
                                          "default OUT.run)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda: where the target "
                               "builds the cache and the drafter trains."),
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Distil a DSpark drafter (parallel trunk + Markov head) from a target model."""
    from .errors import InputError
    from .model.checkpoint import default_model_dir
    from .train.distill import CacheConfig, DistillConfig, DistillTrainer, build_cache

    for name, v in (("--steps", steps), ("--batch", batch), ("--gamma", gamma), ("--window", window)):
        if v < 1:
            raise InputError(f"{name} must be >= 1, got {v}")
    if gamma > 16:
        raise InputError("--gamma must be <= 16 (the drafter's largest block)")
    for name, v in (("--layers", layers), ("--prefix", prefix)):
        if v < 1:
            raise InputError(f"{name} must be >= 1, got {v}")
    if width < 4 or width % 4:
        raise InputError(f"--width must be a positive multiple of 4 (the drafter's heads), got {width}")
    for name, v in (("--natural-windows", natural_windows), ("--onpolicy-windows", onpolicy_windows)):
        if v < 0:
            raise InputError(f"{name} must be >= 0, got {v}")
    if natural_windows + onpolicy_windows < 1:
        raise InputError("--natural-windows plus --onpolicy-windows must be >= 1")
    _setup_torch(threads)
    target = Path(model_dir) if model_dir else default_model_dir()
    cache_dir = Path(cache) if cache else target / "teacher_cache"
    if not (cache_dir / "index.json").is_file():
        if not train_data:
            raise InputError(f"no teacher cache at {cache_dir}; pass --train FASTA... to build it")
        if cache_dir.exists() and not cache_dir.is_dir():
            raise InputError(f"--cache {cache_dir} is a file, not a folder")
        fresh = not cache_dir.exists()
        try:
            build_cache(CacheConfig(target=str(target), out_dir=str(cache_dir),
                                    train=list(train_data), natural_windows=natural_windows,
                                    onpolicy_windows=onpolicy_windows, window=window, seed=0,
                                    device=device),
                        log=lambda m: None if quiet else _say(m))
        except BaseException as exc:
            if fresh:  # no half-built cache left behind
                shutil.rmtree(cache_dir, ignore_errors=True)
            if isinstance(exc, ValueError) and "window + 1" in str(exc):
                raise InputError(f"--train: {exc}; lower --window") from None
            raise
    else:
        from .model.checkpoint import weights_hash

        built_from = json.loads((cache_dir / "index.json").read_text()).get("metadata", {}).get("target_hash")
        if (target / "model.safetensors").is_file() and built_from and built_from != weights_hash(target):
            raise InputError(f"teacher cache {cache_dir} was built from another target than "
                             f"{target}; pass another --cache (with --train) to build one for it")
    dest = Path(out) if out else target / "drafters" / f"seed{seed}"
    cfg = DistillConfig(cache=str(cache_dir), out_dir=run_dir or f"{dest}.run", seed=seed,
                        steps=steps, batch=batch, gamma=gamma, width=width, layers=layers,
                        prefix_len=prefix, device=device)
    trainer = DistillTrainer(cfg)
    if trainer.resume():
        _say(f"evspark: resumed drafter training at step {trainer.step}")
    prog = _progress(steps, quiet, "distill")
    with prog:
        task = prog.add_task("distill", total=steps, completed=trainer.step, note="")
        try:
            trainer.run(lambda st, tot, loss: prog.update(task, completed=st,
                                                          note=f"loss={loss:.4f}"))
        except KeyboardInterrupt:
            _say(f"evspark: interrupted; rerun the same command to resume from "
                 f"{trainer.out / 'ckpt.pt'} (step {_ckpt_step(trainer.out / 'ckpt.pt')})")
            raise typer.Exit(130) from None
    folder = trainer.export(dest)
    _say(f"evspark: wrote drafter {folder} ({trainer.step * batch * gamma:,} supervised positions)")


@app.command()
@handle_errors
def bench(
    model_dir: Optional[str] = ModelOpt,
    preset: str = typer.Option("quick", "--preset", help="quick (minutes) or full (the whole "
                               "protocol: 48 prompts x 1024 tokens x 3 drafter seeds)."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Prompt FASTA (default: the "
                                          "48-prompt suite in ../shared/data/prompts.fa, else "
                                          "examples/prompts.fa)."),
    out: str = typer.Option("bench-results", "-o", "--output", help="Folder for results.json, "
                            "report.md and plots."),
    context_genome: Optional[str] = typer.Option(None, "--context-genome", help="FASTA whose first "
                                                 "record provides the long-context prompts."),
    n_prompts: Optional[int] = typer.Option(None, "--n-prompts", help="Override the preset."),
    new_tokens: Optional[int] = typer.Option(None, "-n", "--max-new-tokens", help="Override the preset."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Drafter seeds, e.g. 0,1,2."),
    gamma: Optional[int] = typer.Option(None, "--gamma", "-g", help="Override the preset."),
    drafter: Optional[List[str]] = typer.Option(None, "--drafter", help="Extra drafter folder(s) "
                                                "to benchmark."),
    baselines: Optional[str] = typer.Option(None, "--baselines", help="Comma list of baseline "
                                            "drafters (default kmer,identity; '' for none)."),
    rollbacks: Optional[str] = typer.Option(None, "--rollbacks", help="Comma list: slice,replay."),
    skip: Optional[str] = typer.Option(None, "--skip", help="Sections to skip: tvd,gamma,context,depth."),
    gammas: Optional[str] = typer.Option(None, "--gammas", help="Gamma sweep, e.g. 1,2,4,8,12,16."),
    contexts: Optional[str] = typer.Option(None, "--contexts", help="Context sweep lengths, e.g. "
                                           "1024,8192,32768."),
    depth: Optional[int] = typer.Option(None, "--depth", help="Depth sweep: tokens of one long "
                                        "generation (0 = skip)."),
    compile_cpu: bool = CompileOpt,
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
) -> None:
    """The evaluation protocol: speedup, acceptance, losslessness and sweeps, into a report."""
    import json

    from .errors import InputError

    _setup_torch(threads)
    from .eval.bench import PRESETS, BenchConfig, bench_drafters, run_bench
    from .model.checkpoint import load_model

    if preset not in PRESETS:
        raise InputError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    root = Path(__file__).resolve().parents[1]
    suite = Path(os.environ.get("EVSPARK_SHARED", root.parent / "shared")) / "data" / "prompts.fa"
    prompt_file = prompts or str(suite if suite.is_file() else root / "examples" / "prompts.fa")
    cfg = BenchConfig(prompts=prompt_file, preset=preset, **PRESETS[preset])
    if n_prompts is not None:
        cfg.n_prompts = n_prompts
    if new_tokens is not None:
        cfg.new_tokens = new_tokens
    if gamma is not None:
        cfg.gamma = gamma
    if seeds:
        try:
            cfg.seeds = [int(x) for x in seeds.split(",")]
        except ValueError:
            raise InputError(f"--seeds must look like 0,1,2, got {seeds!r}") from None
    cfg.context_source = context_genome or ""
    if baselines is not None:
        cfg.baselines = [b for b in baselines.split(",") if b]
    if rollbacks is not None:
        cfg.rollback_modes = [r for r in rollbacks.split(",") if r]
        if not cfg.rollback_modes or set(cfg.rollback_modes) - {"slice", "replay"}:
            raise InputError(f"--rollbacks must list slice and/or replay, got {rollbacks!r}")
    try:
        if gammas:
            cfg.gamma_sweep = [int(x) for x in gammas.split(",")]
        if contexts:
            cfg.contexts = [int(x) for x in contexts.split(",")]
    except ValueError:
        raise InputError("--gammas and --contexts take comma-separated integers") from None
    if depth is not None:
        cfg.depth_tokens = depth
    for name, v in (("--n-prompts", cfg.n_prompts), ("--max-new-tokens", cfg.new_tokens),
                    ("--gamma", cfg.gamma)):
        if v < 1:
            raise InputError(f"{name} must be >= 1, got {v}")
    if any(g < 1 for g in cfg.gamma_sweep) or any(c < 1 for c in cfg.contexts):
        raise InputError("--gammas and --contexts take integers >= 1")
    if any(x < 0 for x in cfg.seeds) or cfg.depth_tokens < 0:
        raise InputError("--seeds and --depth must be >= 0")
    if Path(out).exists() and not Path(out).is_dir():
        raise InputError(f"--output {out} is a file, not a folder")
    if skip:
        cfg.skip = [x for x in skip.split(",") if x]
        bad = set(cfg.skip) - {"tvd", "gamma", "context", "depth"}
        if bad:
            raise InputError(f"--skip: unknown section(s) {', '.join(sorted(bad))}")
    model = load_model(model_dir, device="auto", compile=compile_cpu)
    drafters = bench_drafters(model, cfg, drafter)
    res = run_bench(model, cfg, out, " ".join(["evspark"] + sys.argv[1:]), drafters,
                    log=(lambda m: None) if quiet else _say)
    head = {k: round(v["summary"]["pooled_speedup"], 3) for k, v in res["speed"].items()}
    print(json.dumps({"out": out, "pooled_speedup": head}, indent=1))


def main() -> None:
    """Console entry point: usage errors become one line with exit code 2."""
    try:
        rc = app(standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # typer's vendored click usage errors (never imported directly)
        code = getattr(e, "exit_code", None)
        fmt = getattr(e, "format_message", None)
        if code is not None and fmt is not None:
            msg = " ".join(str(fmt()).split())
            _say(f"evspark: error: {msg}")
            sys.exit(2 if code not in (0, 1) else code or 0)
        if isinstance(e, (EOFError,)):
            sys.exit(1)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
