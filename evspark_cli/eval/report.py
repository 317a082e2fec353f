"""report.md (and PNG plots when matplotlib is installed) from a bench results dict."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def _f(x: Any, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def speed_table(res: dict[str, Any]) -> list[str]:
    lines = ["| drafter / mode / rollback | pooled speedup | min / median / max | tau | "
             "efficiency | verify s per round / native step s | "
             "draft s per round / native step s | non-tie divergences from native |",
             "|---|---|---|---|---|---|---|---|"]
    for name, v in res["speed"].items():
        s = v["summary"]
        step = s["native_step_s"]
        per_round_v = s["verify_s"] / max(s["rounds"], 1) / step
        per_round_d = s["draft_s"] / max(s["rounds"], 1) / step
        div = "-"  # residual sampling is checked in distribution (TVD), not token by token
        key = next((k for k in ("greedy", "coupled") if v["rows"] and k in v["rows"][0]), None)
        if key is not None:
            div = str(sum(1 for r in v["rows"] if r[key]["divergence"] is not None
                          and not r[key]["tie"]))
            ties = sum(1 for r in v["rows"] if r[key]["tie"])
            div += f" (ties {ties})"
        lines.append(f"| {name} | {_f(s['pooled_speedup'])}x | {_f(s['min_speedup'])} / "
                     f"{_f(s['median_speedup'])} / {_f(s['max_speedup'])} | {_f(s['tau'])} | "
                     f"{_f(s.get('efficiency'))} | {_f(per_round_v)} | {_f(per_round_d)} | "
                     f"{div} |")
    return lines


def throughput_table(t: dict[str, Any], mixed: bool = False) -> list[str]:
    """The throughput section: tokens/s by decoder and batch size, and the ratios (`mixed`: the
    mixed prompt lengths workload)."""
    if not t.get("modes"):
        return []
    c = t["config"]
    lo, hi = c.get("prompt_lengths", [None, None])
    what = (f"{c['jobs']} jobs of prompts of {lo:,}-{hi:,} bases with 1-4 samples each x "
            f"{c['new_tokens']} new tokens" if mixed else
            f"{c['records']} records x {c['samples']} samples x {c['new_tokens']} new tokens")
    L = ["", "## Throughput on mixed prompt lengths" if mixed else
         "## Throughput (batched decoding)", "",
         f"{what} (sampled, T=1, top-k 4, gamma {c['gamma']}); every mode on the same jobs, "
         f"the modes interleaved slice by slice in one process, a batch size's native and "
         f"speculative decoders in turns; prefills included. Headline batch "
         f"size: {t.get('headline_batch_size')}.", "",
         "Ratios are against native decoding under the same rule; under `coupled` every "
         "speculative job is also compared with native sampling at batch 1.", "",
         "| decoder | rule | batch | tokens/s | vs single-stream native | "
         "vs native at this batch | tau | efficiency | jobs whose tokens differ from batch 1 | "
         "jobs that differ from native |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    modes = t["modes"]
    for r in modes.values():
        rule = r.get("rule", "residual")
        suffix = "" if rule == "residual" else f"/{rule}"
        single = modes.get(f"native/b1{suffix}", {}).get("tokens_per_s")
        same = modes.get(f"native/b{r['batch_size']}{suffix}", {}).get("tokens_per_s")
        tps = r["tokens_per_s"]
        vs_single = tps / single if single and tps else None
        vs_same = tps / same if same and tps and r["decoder"] == "speculative" else None
        changed = r["jobs_changed_vs_batch_1"]
        native = r.get("jobs_differing_from_native")
        L.append(f"| {r['decoder']} | {rule} | {r['batch_size']} | {_f(tps, 0)} | "
                 f"{_f(vs_single)}x | {_f(vs_same)}{'x' if vs_same else ''} | {_f(r['tau'])} | "
                 f"{_f(r.get('efficiency'))} | {'-' if changed is None else changed} | "
                 f"{'-' if native is None else native} |")
    return L


def write_report(res: dict[str, Any], out: Path) -> Path:
    m = res["machine"]
    L = [f"# EvSpark benchmark — {res['model']} ({res['parameters']:,} parameters)", "",
         f"Date: {res['date']}. Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} "
         f"({m['torch_threads']} threads), CUDA: {m['cuda'] or 'none'}. "
         f"Wall time {res['wall_s']:.0f} s.",
         "", f"Command: `{res['command']}`", "",
         f"Preset `{res['config']['preset']}`: {res['config']['n_prompts']} prompts x "
         f"{res['config']['new_tokens']} new tokens, gamma {res['config']['gamma']}; native and "
         "speculative decoding interleaved per prompt in one process (speedup = native time / "
         "speculative time, pooled = total / total).", ""]
    timing = res.get("timing")
    if timing:
        verdict = ("steady" if timing["reliable"] else
                   f"**UNRELIABLE** (more than {100 * timing['limit']:.0f}%: a busy machine; "
                   "treat every speedup below with caution)")
        L += [f"Timing noise: {len(timing['native_repeats_s'])} native passes of the first "
              f"prompt differed by {100 * timing['spread']:.0f}%: {verdict}.", ""]
    L += ["## Speed and greedy losslessness", ""]
    L += speed_table(res) if res["speed"] else ["(skipped)"]
    L += ["", "Conditional acceptance per draft position (sampled, slice):", ""]
    for name, v in res["speed"].items():
        if "/sampled/slice" in name:
            ca = v["summary"]["conditional_acceptance"]
            L.append(f"- {name}: " + ", ".join(_f(x) for x in ca))
    sl = res.get("sampled_losslessness", {})
    if sl.get("summary"):
        s = sl["summary"]
        L += ["", "## Sampled losslessness (T=1, top-k 4)", "",
              f"{len(sl['rows'])} prompts x {sl['samples_per_set']} samples x "
              f"{sl['tokens_per_sample']} tokens per set. TVD/KL of speculative vs native A, "
              "and of native B vs native A (the noise floor at matched N).", "",
              "| statistic | speculative vs native | native vs native (floor) |", "|---|---|---|"]
        for k in (1, 3):
            L.append(f"| {k}-mer TVD | {_f(s[f'tvd{k}_spec'], 4)} | {_f(s[f'tvd{k}_floor'], 4)} |")
            L.append(f"| {k}-mer KL | {_f(s[f'kl{k}_spec'], 4)} | {_f(s[f'kl{k}_floor'], 4)} |")
        worst = sorted(sl["rows"], key=lambda r: r["tvd3_spec"] - r["tvd3_floor"], reverse=True)[:3]
        L += ["", "Worst prompts (3-mer TVD above floor): " + "; ".join(
            f"{r['prompt']} {r['tvd3_spec']:.3f} vs {r['tvd3_floor']:.3f} (complexity "
            f"{r['complexity']:.2f})" for r in worst)]
    if res.get("gamma_sweep"):
        L += ["", "## Gamma sweep (sampled)", "", "| gamma | pooled speedup | tau |",
              "|---|---|---|"]
        L += [f"| {r['gamma']} | {_f(r['pooled_speedup'])}x | {_f(r['tau'])} |"
              for r in res["gamma_sweep"]]
    if res.get("context_sweep"):
        L += ["", "## Context sweep (prompt cut from a whole genome)", "",
              "Each prompt is prefilled once; native and speculative decoding then start from "
              "copies of that state, so the decode speedup is decoding alone. Peak RSS is the "
              "process's peak so far (contexts run in increasing order).", "",
              "| context | prefill s | prefill tok/s | peak RSS MiB | state MiB | native tok/s | "
              "decode speedup | end-to-end speedup | tau |",
              "|---|---|---|---|---|---|---|---|---|"]
        for r in res["context_sweep"]:
            if "skipped" in r:
                L.append(f"| {r['context']} | skipped: {r['skipped']} | | | | | | | |")
            else:
                L.append(f"| {r['context']} | {_f(r['prefill_s'], 1)} | "
                         f"{_f(r.get('prefill_tok_s'), 0)} | {_f(r.get('peak_rss_mib'), 0)} | "
                         f"{_f(r.get('state_mib'), 1)} | {_f(r.get('native_tok_s'), 0)} | "
                         f"{_f(r['decode_speedup'])}x | {_f(r['end_to_end_speedup'])}x | "
                         f"{_f(r['tau'])} |")
    if res.get("depth_sweep"):
        d = res["depth_sweep"]
        L += ["", f"## Depth sweep: {d['tokens']} tokens, speedup {_f(d['speedup'])}x, "
              f"tau {_f(d.get('tau'))}", "",
              "| tokens | speedup | tau | native tok/s |", "|---|---|---|---|"]
        L += [f"| {w.get('start_token', '')}-{w['end_token']} | {_f(w.get('speedup'))}x | "
              f"{_f(w['tau'])} | {_f(w.get('native_tok_s'), 0)} |" for w in d["windows"]]
    L += throughput_table(res.get("throughput") or {})
    L += throughput_table((res.get("throughput") or {}).get("mixed") or {}, mixed=True)
    plots = _plots(res, out)
    L += [""] + [f"![{p.stem}]({p.name})" for p in plots]
    path = out / "report.md"
    path.write_text("\n".join(L) + "\n")
    return path


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _acceptance_plot(plt: Any, res: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, v in res["speed"].items():
        if "/sampled/slice" in name:
            ca = v["summary"]["conditional_acceptance"]
            ax.plot(range(1, len(ca) + 1), [x or 0 for x in ca], marker="o",
                    label=name.split("/")[0])
    ax.set_xlabel("draft position")
    ax.set_ylabel("conditional acceptance")
    ax.legend(fontsize=7)
    return _save(plt, fig, out / "acceptance.png")


def _plots(res: dict[str, Any], out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    if res["speed"]:
        paths.append(_acceptance_plot(plt, res, out))
    if res.get("gamma_sweep"):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        g = res["gamma_sweep"]
        ax.plot([r["gamma"] for r in g], [r["pooled_speedup"] for r in g], marker="o",
                label="speedup")
        ax.plot([r["gamma"] for r in g], [r["tau"] for r in g], marker="s", label="tau")
        ax.set_xlabel("gamma")
        ax.legend()
        paths.append(_save(plt, fig, out / "gamma.png"))
    ctx = [r for r in res.get("context_sweep", []) if "skipped" not in r]
    if ctx:
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        xs = [r["context"] for r in ctx]
        ax.plot(xs, [r["decode_speedup"] for r in ctx], marker="o", label="decode speedup")
        ax.plot(xs, [r["tau"] for r in ctx], marker="s", label="tau")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax2 = ax.twinx()
        ax2.plot(xs, [r.get("native_tok_s", 0) for r in ctx], color="grey", linestyle=":",
                 marker="^", label="native tok/s")
        ax2.set_ylabel("native tokens/s")
        fig.legend(fontsize=7, loc="upper right")
        paths.append(_save(plt, fig, out / "context.png"))
    modes = (res.get("throughput") or {}).get("modes") or {}
    if modes:
        paths += _throughput_plots(plt, modes, out)
    depth = res.get("depth_sweep") or {}
    if depth.get("windows"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ends = [w["end_token"] for w in depth["windows"]]
        ax.plot(ends, [w.get("speedup") or 0 for w in depth["windows"]], marker=".",
                label="speedup")
        ax.plot(ends, [w["tau"] or 0 for w in depth["windows"]], marker=".", label="tau")
        ax.set_xlabel("generated tokens (window end)")
        ax.legend(fontsize=7)
        paths.append(_save(plt, fig, out / "depth.png"))
    return paths


def _throughput_plots(plt: Any, modes: dict[str, Any], out: Path) -> list[Path]:
    """Tokens/s by batch size per decoder and rule, and the speedup over native decoding at the
    same batch size per rule."""
    rules = sorted({r.get("rule", "residual") for r in modes.values()})
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    fig2, ax2 = plt.subplots(figsize=(5.5, 3.5))
    for rule in rules:
        by = {(r["decoder"], r["batch_size"]): r["tokens_per_s"] or 0 for r in modes.values()
              if r.get("rule", "residual") == rule}
        for decoder, marker in (("native", "o"), ("speculative", "s")):
            sizes = sorted(b for d, b in by if d == decoder)
            ax.plot(sizes, [by[decoder, b] for b in sizes], marker=marker,
                    label=f"{decoder} ({rule})")
        both = sorted(b for d, b in by if d == "speculative" and by.get(("native", b)))
        ax2.plot(both, [by["speculative", b] / by["native", b] for b in both], marker="s",
                 label=rule)
    for a, ylabel in ((ax, "tokens/s"), (ax2, "speedup over native at this batch")):
        a.set_xscale("log", base=2)
        a.set_xlabel("batch size (rows)")
        a.set_ylabel(ylabel)
        a.legend(fontsize=7)
    return [_save(plt, fig, out / "throughput.png"),
            _save(plt, fig2, out / "speedup_by_batch.png")]
