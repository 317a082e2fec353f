"""The decoder: jobs (records x samples) scheduled into at most B rows, one round at a time.

Every round, each live row drafts up to gamma tokens (none without a drafter: a native step),
one `extend` verifies all rows at once (a block of 1 + the largest draft count), and each row
keeps its own accepted prefix plus one correction or bonus token: `block.commit(j)` with one j
per row. A row that has its tokens leaves; the next queued job takes its slot (continuous
batching). Native decoding is the same loop without a drafter: a decode step is a block of one.

A job's prompt is prefilled once per record: the samples of a record share one prefill, forked
into as many rows as there are free slots (`InferenceState.select`). Prefill runs between
rounds, a whole prompt at a time (chunked as usual): on a CPU the prefill and the decoding rows
compete for the same cores, so interleaving prefill chunks with rounds would not raise the run's
throughput, only spread the pause over more rounds; and each round keeps a fixed shape.

Lossless per row: a row's random numbers are keyed by (seed, record, sample, position, purpose),
and every quantity of the acceptance rule is computed from that row's entries alone, so a row's
tokens do not depend on which rows share its batch, except where batched arithmetic rounds a
float differently in the last place (a product over 16 rows need not round as one over 1 row);
`evspark bench`'s throughput section counts how often that changes a token.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError, RunError
from ..model.model import StripedHyena
from ..model.state import InferenceState
from .acceptance import accepted_matches, decide_rows
from .drafters.base import DraftContext, Drafter, DraftRows, Proposal
from .jobs import DecodeResult, Job, Outcome, RoundReport, largest_draft, row_reserve
from .prefill import Prefilled, PromptCache, prefill_prompt
from .sampling import Purpose, SamplerConfig, coupled_draw, sample_from_probs, sampler_probs
from .schedule import DraftSchedule, block_costs
from .tree import TreeSizer, share_rows

ROLLBACKS = ("slice", "replay")


def all_finite(logits: Tensor) -> bool:
    """True when no entry is NaN or inf. One sum shows any of them (a sum that only overflows
    is rechecked entry by entry), cheaper than isfinite(...).all() on every round."""
    return math.isfinite(float(logits.sum())) or bool(torch.isfinite(logits).all())


def nonfinite_error(position: int, label: str) -> RunError:
    where = f"record '{label}', " if label else ""
    return RunError(f"{where}position {position}: the model produced NaN or inf logits")


def dense_layout(model: StripedHyena) -> bool:
    """Whether the decoder keeps its rows' KV in the dense layout (kvcache.py): on a GPU, or
    with recorded graphs, which replay fixed shapes; a CPU run keeps rows in size classes."""
    return model.device.type != "cpu" or model.graphs is not None


@dataclass
class _Row:
    """A live row: its job, the anchor (newest token not yet fed) and what it produced."""

    job: Job
    anchor: int
    result: DecodeResult
    t_start: float

    @property
    def remaining(self) -> int:
        return self.job.max_new_tokens - len(self.result.tokens)


class BatchDecoder:
    """Decodes jobs in batches of at most `batch_size` rows (see the module docstring)."""

    def __init__(self, model: StripedHyena, sampler: SamplerConfig, drafter: Drafter | None,
                 gamma: int, batch_size: int = 1, rollback: str = "slice",
                 track_margins: bool = False,
                 on_round: Callable[[RoundReport], None] | None = None,
                 capacity: int | None = None, adaptive: bool = False,
                 on_prefill: Callable[[Job, int, int], None] | None = None,
                 tree_rows: int = 0, prompt_cache: PromptCache | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """`capacity`: KV positions to reserve per row when the first batch is built (the run's
        longest prompt + new tokens + a block), so the caches never grow mid-run: the dense
        layout (kvcache.py) that recorded graphs replay and a GPU prefers, taken on a GPU or
        with graphs. On a CPU each row keeps the capacity its prefill reserved, in its size
        class, so one long prompt does not cost every row its memory. `adaptive`: choose each
        round's draft length by confidence (`schedule.py`), where the rule makes the output
        independent of it (greedy, coupled); elsewhere every round drafts `gamma`.
        `on_prefill(job, done, total)`: a prefill's progress in bases (`prefill.PrefillProgress`),
        told between its chunks, for the displays that would otherwise stall for minutes on a
        long prompt. `tree_rows`: the most branch rows (`tree.py`) one live row may take while
        the batch has free rows and nothing is queued (0: none); greedy and coupled only, with
        the slicing rollback and a drafter that scores its paths. `prompt_cache`: prefilled
        prompts kept across records and decoders (a server's requests that repeat a prompt);
        by default only a record's samples share its prefill. `clock`: the decoder's time
        (rows' wall times and progress stamps), paused while other decoders take their turns
        when several are timed side by side (`interleave.py`)."""
        if rollback not in ROLLBACKS:
            raise InputError(f"rollback must be one of {', '.join(ROLLBACKS)}, got {rollback!r}")
        if batch_size < 1:
            raise InputError(f"batch size must be >= 1, got {batch_size}")
        self.model, self.sampler, self.drafter = model, sampler, drafter
        self.gamma = gamma if drafter is not None else 0
        self.batch_size, self.rollback = batch_size, rollback
        self.track_margins = track_margins
        self.dense = dense_layout(model)
        self.capacity = capacity if self.dense else None
        self.on_round = on_round
        self.on_prefill = on_prefill
        self.clock = clock
        self.mode = "speculative" if drafter is not None else "native"
        self.on_gpu = model.device.type != "cpu"
        self.prefix = drafter.prefix_len if drafter is not None else 0
        self.tree_rows = tree_rows if (drafter is not None and drafter.scores_paths
                                       and rollback == "slice"
                                       and (sampler.greedy or sampler.coupled)) else 0
        self.branch_of: list[int] = []  # state rows past the live rows: branches of these rows
        self.sizer: TreeSizer | None = None  # how many branches pay (made at the first tree)
        self._width = 0  # branches per live row when they were made
        self.schedule: DraftSchedule | None = None
        if adaptive and drafter is not None and (sampler.greedy or sampler.coupled):
            self.schedule = DraftSchedule(block_costs(model, batch_size, self.gamma + 1),
                                          self.gamma, not sampler.greedy)
        # rows live in step: self.state's row b is self.rows[b] and self.draft's row b
        self.state: InferenceState | None = None
        self.rows: list[_Row] = []
        self.draft: DraftRows | None = None
        self._shared: tuple[int, Prefilled] | None = None  # the last record's prefill
        self.prompt_cache = prompt_cache
        self.tokens_emitted = 0  # by every row so far: how far the run has come (interleave.py)
        self._finished: list[int] = []  # slots of rows whose outcome the last step gave back:
        #                                 they leave at the next step, so a caller sees the
        #                                 batch as that round left it

    # ------------------------------------------------------------------ the run
    def run(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        """Yield each job's outcome as it finishes (completion order, not input order)."""
        yield from self.run_from(JobList(iter(jobs)))

    def run_from(self, source: JobSource) -> Iterator[Outcome]:
        """`run` over a job source that may grow while the run goes (a server's queue): the
        run ends when no row is live and the source has nothing queued."""
        while (done := self.step(source)) is not None:
            yield from done

    @torch.inference_mode()
    def step(self, source: JobSource) -> list[Outcome] | None:
        """One round: queued jobs first take the free slots (a new batch, finished rows' slots,
        or slots added to a batch that has fewer than `batch_size` rows: continuous batching
        across a server's requests), then every live row takes a round. The outcomes that
        finished (or failed), or None when no row is live and nothing is queued. A finished
        row stays in the batch until the next step (the caller sees the state its last round
        left)."""
        out: list[Outcome] = []
        if self.branch_of and (self._finished or (len(self.rows) < self.batch_size
                                                  and source.peek() is not None)):
            self._prune()  # rows change: branches give their rows back first
        if self._finished:  # the last round's finished rows leave (or queued jobs take them)
            out += self._refill(source, self._finished)
            self._finished = []
        if len(self.rows) < self.batch_size and source.peek() is not None:
            out += self._fill(source, free=range(len(self.rows), self.batch_size))[0]
        if not self.rows:
            if out or source.peek() is not None:
                return out
            self._shared = None  # the run is over: its last prefill can go
            return None
        if self.tree_rows and not self.branch_of and source.peek() is None:
            self._branch()  # free rows nobody queued for: token trees
        done, self._finished = self._round()
        if self.branch_of and self.sizer is not None and self.sizer.width < self._width:
            self._prune()  # fewer branches pay: made anew, at the new width, next step
        return out + done

    def live(self) -> list[tuple[Job, DecodeResult]]:
        """Each live row's job and what it has produced so far (tokens grow round by round)."""
        return [(r.job, r.result) for r in self.rows]

    def drop(self, indices: set[int] | frozenset[int]) -> list[Job]:
        """Take the rows of the jobs with these `index`es out of the batch (a client that went
        away): their jobs, unfinished. The other rows go on untouched (a row's tokens never
        depend on its neighbours)."""
        if self.branch_of:
            self._prune()
        for slot in sorted(self._finished, reverse=True):  # finished rows leave first
            self._remove(slot)
        self._finished = []
        slots = [b for b, r in enumerate(self.rows) if r.job.index in indices]
        jobs = [self.rows[b].job for b in slots]
        for slot in sorted(slots, reverse=True):
            self._remove(slot)
        return jobs

    def _round(self) -> tuple[list[Outcome], list[int]]:
        """One round for every live row: the outcomes of the rows that finished or failed, and
        their slots."""
        model, state, rows = self.model, self.state, self.rows
        assert state is not None
        t0 = self.clock()
        B = len(rows)
        gammas = [largest_draft(self.gamma, r.remaining) for r in rows]
        G = max(gammas)
        anchors = torch.tensor([[r.anchor] for r in rows], dtype=torch.long)
        prop = None
        if G > 0:
            assert self.draft is not None
            prop = self.draft.propose(state, [r.anchor for r in rows], gammas)
            if self.schedule is not None:
                G = self._scheduled(prop, gammas, state.lengths)
                gammas = [min(g, G) for g in gammas]
            ids = torch.cat([anchors, prop.drafts[:, :G]], dim=1)
        else:
            ids = anchors
        fed = ids[:, 1:]
        owner = list(range(B)) + self.branch_of  # the live row each state row decodes for
        if self.branch_of:  # branch rows: alternative drafts (the live row's, when none)
            fed = torch.cat([fed, self._branch_drafts(prop, fed, gammas)])
            ids = torch.cat([ids[owner, :1], fed], dim=1)
        t1 = self.clock()
        if self.on_gpu:
            ids = ids.to(model.device)
        snapshot = state.clone() if self.rollback == "replay" else None
        t_block = self.clock()
        logits, hidden, block = model.extend(state, ids)
        t_block = self.clock() - t_block  # (on a GPU: the launch; the sum syncs below)
        N, k, V = logits.shape
        p = sampler_probs(logits.reshape(N * k, V), self.sampler).view(N, k, V)
        pos = state.lengths  # row b's anchor sits at pos[b]; its draft j at pos[b] + j
        all_gammas = [gammas[o] for o in owner]
        if self.sampler.coupled or self.branch_of:
            m_all, y, gap = self._coupled(p, pos, fed if prop is not None else None,
                                          all_gammas, owner)
            win = self._winners(m_all, B)
            m = [m_all[w] for w in win]
            nxt = [y[w] for w in win]
            gaps = [gap[w] for w in win]
        else:
            m, nxt = self._residual(p, pos, prop, gammas)
            win, m_all = list(range(B)), m
        bad = self._nonfinite_rows(logits[win] if self.branch_of else logits, m, pos)
        margins = None
        if self.track_margins:  # the native step's tie margin: logit gap, or perturbed-score gap
            margins = gaps if self.sampler.coupled and not self.sampler.greedy else \
                self._margins(logits[:B])
        counts = [x + 1 for x in m]
        t_commit = self.clock()
        if snapshot is not None:
            self.state = model.extend(snapshot, ids[:, : max(counts)])[2].commit(counts)
        elif self.branch_of:  # every row of a job takes its winning row's tokens
            source = win + [win[o] for o in self.branch_of]
            self.state = block.commit([counts[o] for o in owner], source)
        else:
            self.state = block.commit(counts if prop is not None else 1)
        t2 = self.clock()
        if self.sizer is not None and prop is not None:
            per_row: list[list[int]] = [[x] for x in m_all[:B]]
            for t, o in enumerate(self.branch_of):
                per_row[o].append(m_all[B + t])
            self.sizer.observe(per_row, k, self.clock() - t0)
        if self.schedule is not None and prop is not None:
            self.schedule.observe(gammas, m_all[:B])  # the live rows' own drafts
        if self.draft is not None:
            self.draft.observe(ids[win] if self.branch_of else ids,
                               hidden[win] if self.branch_of else hidden, counts)
        finished: list[int] = []
        done: list[Outcome] = []
        emitted = 0
        kept = fed[win].tolist() if prop is not None else None
        branches = [0] * B
        for o in self.branch_of:
            branches[o] += 1
        for b, r in enumerate(rows):
            res = r.result
            if b in bad:
                finished.append(b)
                done.append(Outcome(r.job, error=nonfinite_error(bad[b], r.job.label)))
                continue
            new = kept[b][: m[b]] + [nxt[b]] if kept is not None else [nxt[b]]
            res.tokens.extend(new)
            res.verified += k * (1 + branches[b])
            emitted += len(new)
            r.anchor = nxt[b]
            if margins is not None:
                res.margins.append(margins[b])
            if prop is not None or self.drafter is not None:  # rounds are a speculative notion
                res.rounds += 1
                res.accepted.append(m[b])
                res.proposed.append(gammas[b])
                res.branch_rows += branches[b]
                res.branch_wins += win[b] != b
                for j in range(gammas[b]):
                    res.position_trials[j] += j <= m[b]
                    res.position_accepts[j] += j < m[b]
                res.draft_s += t1 - t0
                res.verify_s += t2 - t1
            res.progress.append((len(res.tokens), t2 - r.t_start))
            if r.remaining <= 0:
                finished.append(b)
                res.wall_s = self.clock() - r.t_start
                done.append(Outcome(r.job, result=res))
        spent = self.clock() - t0
        self.tokens_emitted += emitted
        for r in rows:
            r.result.decode_s += spent / B
        if self.on_round is not None:
            self.on_round(RoundReport(emitted, B, sum(m), sum(gammas), spent))
        if self.schedule is not None and prop is not None:
            self.schedule.note_round(N, k, self.clock() - t0, t_block + t2 - t_commit)
        return done, finished

    def _winners(self, m_all: list[int], B: int) -> list[int]:
        """Per live row, the state row (itself or one of its branches) that accepted the most
        drafts; the live row itself on a tie."""
        win = list(range(B))
        for t, o in enumerate(self.branch_of):
            if m_all[B + t] > m_all[win[o]]:
                win[o] = B + t
        return win

    def _branch_drafts(self, prop: Proposal | None, fed: Tensor, gammas: list[int]) -> Tensor:
        """The drafts of the branch rows (T, G): each live row's most likely alternatives to
        its own drafts (`DraftPaths.branches`), its own drafts where it has fewer."""
        out = fed[self.branch_of].clone()
        if prop is None or prop.paths is None:
            return out
        wanted = [0] * len(gammas)
        for o in self.branch_of:
            wanted[o] += 1
        alts = [prop.paths.branches(b, fed[b, : gammas[b]].tolist(), n) if n and gammas[b]
                else [] for b, n in enumerate(wanted)]
        taken = [0] * len(gammas)
        for t, o in enumerate(self.branch_of):
            if taken[o] < len(alts[o]):
                out[t, : gammas[o]] = torch.tensor(alts[o][taken[o]], dtype=out.dtype)
                taken[o] += 1
        return out

    def _branch(self) -> None:
        """Give the free rows to the live rows as branches (`tree.py`): each branch row is a
        copy of its row's state, made once; `Block.commit(j, source)` keeps it in step."""
        assert self.state is not None
        if self.sizer is None:
            self.sizer = TreeSizer(block_costs(self.model, self.batch_size, self.gamma + 1),
                                   self.tree_rows)
        B = len(self.rows)
        able = [b for b, r in enumerate(self.rows) if r.remaining > 1]
        shares = share_rows(self.batch_size - B, len(able))
        owners = [b for b, n in zip(able, shares) for _ in range(min(n, self.sizer.width))]
        if not owners:
            return
        self._width = max(min(n, self.sizer.width) for n in shares)
        self.state = InferenceState.gather([(self.state, range(B)), (self.state, owners)])
        if self.dense:
            for c in self.state.caches():
                c.reserve(self.capacity or 0)
        self.branch_of = owners

    def _prune(self) -> None:
        """The branch rows leave (rows are about to change: a job joins or leaves)."""
        assert self.state is not None
        for row in range(self.state.batch - 1, len(self.rows) - 1, -1):
            self.state = self.state.remove(row)
        self.branch_of = []

    def _scheduled(self, prop: Proposal, gammas: list[int], pos: tuple[int, ...]) -> int:
        """The drafts this round verifies, chosen from the drafter's confidence in each: under
        the coupled rule its perturbed-score gap (the same noise the drafts were drawn with)."""
        assert self.schedule is not None
        G = max(gammas)
        if G == 0 or self.sampler.greedy:
            return self.schedule.choose(None, gammas)
        B, V = len(gammas), prop.q.shape[-1]
        if prop.confidence is not None:  # the drafter's own gaps: the same numbers, no draw
            return self.schedule.choose(prop.confidence[:, :G], gammas)
        _, gap = coupled_draw(prop.q[:, :G].reshape(B * G, V), *self._noise_keys(pos[:B], G),
                              self.sampler)
        return self.schedule.choose(gap.view(B, G), gammas)

    def _noise_keys(self, pos: tuple[int, ...], k: int, owner: Sequence[int] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Coupled-noise keys and positions of the k positions after each row's anchor, row by
        row (B * k entries, host int64 arrays): state row i decodes for live row owner[i]
        (default: row i)."""
        owner = range(len(pos)) if owner is None else owner
        keys = [self.rows[o].job.rng.coupled for o in owner]
        return (np.array([key for key in keys for _ in range(k)], dtype=np.int64),
                np.array([t + j for t in pos for j in range(1, k + 1)], dtype=np.int64))

    def _residual(self, p: Tensor, pos: tuple[int, ...], prop: Proposal | None,
                  gammas: list[int]) -> tuple[list[int], list[int]]:
        """The residual rule: accepted drafts per row and the next token (a correction drawn
        from the residual, a bonus or native token drawn from p̃), by inverse-CDF draws."""
        rows, B = self.rows, p.shape[0]
        if prop is not None:
            G = max(gammas)
            u_acc = torch.tensor([r.job.rng.floats(range(pos[b] + 1, pos[b] + g + 1),
                                                   Purpose.ACCEPT) + [1.0] * (G - g)
                                  for b, (r, g) in enumerate(zip(rows, gammas))],
                                 dtype=torch.float64)  # padding past a row's drafts: unused
            n, dist = decide_rows(p, prop.q[:, :G], prop.drafts[:, :G], u_acc, gammas)
            m = n.tolist()
        else:
            m, dist = [0] * B, p[:, 0]  # a native step: p̃ itself (drawn from in fp64 below)
        # the bonus token is a plain draw from p̃ (SAMPLE stream); a correction has its own stream
        u_next = [r.job.rng.float(pos[b] + m[b] + 1, Purpose.SAMPLE if m[b] == g
                                  else Purpose.RESIDUAL)
                  for b, (r, g) in enumerate(zip(rows, gammas))]
        nxt = sample_from_probs(dist, torch.tensor(u_next, dtype=torch.float64,
                                                   device=dist.device)).tolist()
        return m, nxt

    def _coupled(self, p: Tensor, pos: tuple[int, ...], drafts: Tensor | None,
                 gammas: list[int], owner: list[int]
                 ) -> tuple[list[int], list[int], list[float]]:
        """The coupled rule (greedy is its zero-noise case) for every state row (`owner`: the
        live row whose job and position it decodes): the target's Gumbel-max token at every
        verified position, the drafts accepted while they equal it, and per row the target's
        token at the first mismatch (or after the last draft): native sampling's tokens. Also
        each row's margin there."""
        N, k, V = p.shape
        keys, at = self._noise_keys(pos, k, owner)  # a branch row: its live row's noise
        y, gap = coupled_draw(p.reshape(N * k, V), keys, at, self.sampler)
        y, gap = y.view(N, k).cpu(), gap.view(N, k).numpy()
        m = [0] * N if drafts is None else accepted_matches(y, drafts, gammas)
        rows = np.arange(N)
        y_host = y.numpy()
        return m, y_host[rows, m].tolist(), gap[rows, m].tolist()

    def _nonfinite_rows(self, logits: Tensor, m: list[int], pos: tuple[int, ...]
                        ) -> dict[int, int]:
        """Rows whose used logits (anchor .. first rejection) hold NaN or inf: row -> position.
        Rows after a row's first rejection never matter, as in native decoding."""
        if all_finite(logits):
            return {}
        ok = torch.isfinite(logits).all(dim=-1).tolist()  # (B, k)
        bad = {}
        for b, flags in enumerate(ok):
            used = flags[: m[b] + 1]
            if not all(used):
                bad[b] = pos[b] + 1 + used.index(False)
        return bad

    def _margins(self, logits: Tensor) -> list[float]:
        top = torch.topk(logits[:, 0].float(), 2, dim=-1).values
        return (top[:, 0] - top[:, 1]).tolist()

    def share_prefill(self, job: Job, prefilled: Prefilled) -> None:
        """Start `job`'s record from `prefilled` (a copy of it) instead of prefilling again."""
        self._shared = ((job.rng.record, job.prompt), prefilled)

    # ------------------------------------------------------------------ rows come and go
    def _refill(self, queue: JobSource, finished: list[int]) -> list[Outcome]:
        """Queued jobs take the finished slots; slots nobody takes leave the batch."""
        failed, vacant = self._fill(queue, free=sorted(finished))
        for slot in sorted(vacant, reverse=True):
            self._remove(slot)
        return failed

    def _fill(self, queue: JobSource, free: Sequence[int]
              ) -> tuple[list[Outcome], Sequence[int]]:
        """Put queued jobs into the `free` slots (a new batch when there is none): the outcomes
        of jobs whose prefill failed, and the slots left free."""
        joins: list[tuple[Sequence[int], list[Job], Prefilled, float]] = []
        failed: list[Outcome] = []
        while free and queue.peek() is not None:
            first = queue.next()
            group = [first]
            while len(group) < len(free) and _same_prompt(queue.peek(), first):
                group.append(queue.next())
            t_start = self.clock()
            try:
                pre = self._prefilled(first)
            except Exception as exc:  # noqa: BLE001 - one bad record must not sink the rest
                failed.extend(Outcome(job, error=exc) for job in group)
                while _same_prompt(queue.peek(), first):
                    failed.append(Outcome(queue.next(), error=exc))
                continue
            joins.append((free[: len(group)], group, pre, t_start))
            free = free[len(group):]
        if joins:
            self._join(joins)
        return failed, free

    def _prefilled(self, job: Job) -> Prefilled:
        """The job's prompt prefilled (once for all the samples of a record)."""
        if self._shared is not None and self._shared[0] == (job.rng.record, job.prompt):
            pre = self._shared[1]
            return Prefilled(pre.state, pre.anchor, pre.hidden, 0.0)
        self._shared = None  # the previous record's prefill can go before this one is made
        reserve = row_reserve(job.max_new_tokens, self._slots(job))
        if self.capacity is not None:  # dense: every row at the run's capacity, so that a new
            # batch's rows lie in one tensor as they are copied (no second copy to widen them)
            reserve = max(reserve, self.capacity - (len(job.prompt) - 1))
        key = (job.prompt, reserve, self.prefix)
        if self.prompt_cache is not None and (kept := self.prompt_cache.get(key)) is not None:
            self._shared = ((job.rng.record, job.prompt), kept)
            return Prefilled(kept.state, kept.anchor, kept.hidden, 0.0)
        hook = self.on_prefill
        tell = (lambda done, total: hook(job, done, total)) if hook is not None else None
        pre = prefill_prompt(self.model, job.prompt, reserve=reserve, keep_hidden=self.prefix,
                             progress=tell)
        self._shared = ((job.rng.record, job.prompt), pre)
        if self.prompt_cache is not None:
            self.prompt_cache.put(key, pre)
        return pre

    def _join(self, joins: list[tuple[Sequence[int], list[Job], Prefilled, float]]) -> None:
        """Rows for each group of jobs (one prompt's samples) forked from its prefill into its
        slots, each row's state copied once: a new batch at the start, rows appended to a batch
        with free slots (a server's new request), else in place of finished rows."""
        parts, rows, contexts, slots = [], [], [], []
        for group_slots, jobs, pre, t_start in joins:
            parts.append((pre.state, [0] * len(jobs)))  # the prefill's row, forked per job
            hidden = pre.hidden_for(self.prefix)
            for i, j in enumerate(jobs):
                first = pre.seconds if i == 0 else 0.0
                rows.append(_Row(j, pre.anchor, self._fresh_result(first, j), t_start))
                contexts.append(DraftContext(self.model, list(j.prompt), self.sampler, j.rng,
                                             hidden))
            slots.extend(group_slots)
        new_draft = self.drafter.rows(contexts) if self.drafter is not None else None
        if self.state is None or slots[0] >= len(self.rows):  # a new batch, or rows added
            assert slots == list(range(len(self.rows), len(self.rows) + len(rows)))
            # a new batch: one copy of every row; rows added: theirs only
            self.state = (InferenceState.gather(parts) if self.state is None
                          else self.state.append(parts))
            self.rows += rows
            if self.draft is None:
                self.draft = new_draft
            elif new_draft is not None:
                self.draft.append(new_draft)
            if self.dense:  # one tensor per cache, at least every row's capacity
                for c in self.state.caches():
                    c.reserve(self.capacity or 0)
            return
        at = 0
        for state, forks in parts:  # each record's rows copied into their slots from its prefill
            self.state = self.state.place(slots[at: at + len(forks)], state, forks)
            at += len(forks)
        for s, r in zip(slots, rows):
            self.rows[s] = r
        if new_draft is not None:
            assert self.draft is not None
            self.draft.place(slots, new_draft)

    def _remove(self, slot: int) -> None:
        last = self.rows.pop()
        if slot < len(self.rows):
            self.rows[slot] = last
        if not self.rows:
            self.state, self.draft = None, None
            return
        assert self.state is not None
        self.state = self.state.remove(slot)
        if self.draft is not None:
            self.draft.remove(slot)

    def _slots(self, job: Job) -> int:
        """The most drafts a round of this job proposes (never past its last token)."""
        return largest_draft(self.gamma, job.max_new_tokens)

    def _fresh_result(self, prefill_s: float, job: Job) -> DecodeResult:
        width = self._slots(job)
        return DecodeResult([], 0.0, self.mode, position_accepts=[0] * width,
                            position_trials=[0] * width, prefill_s=prefill_s)


def _same_prompt(job: Job | None, first: Job) -> bool:
    """Jobs that can share `first`'s prefill: the same record and prompt (its samples)."""
    return job is not None and job.rng.record == first.rng.record and job.prompt == first.prompt


class JobSource(Protocol):
    """Where a decoder takes its jobs from, one job of look-ahead: a run's job list
    (`JobList`) or a server's queue, which may be empty now and hold jobs later."""

    def peek(self) -> Job | None:
        """The next job, without taking it; None when none is queued now."""

    def next(self) -> Job:
        """Take the next job (after `peek` returned it)."""


class JobList:
    """An iterator with one job of look-ahead (jobs are pulled lazily: a run may be huge)."""

    def __init__(self, it: Iterator[Job]) -> None:
        self._it = it
        self._head: Job | None = None
        self._done = False

    def peek(self) -> Job | None:
        if self._head is None and not self._done:
            self._head = next(self._it, None)
            self._done = self._head is None
        return self._head

    def next(self) -> Job:
        job = self.peek()
        if job is None:
            raise StopIteration
        self._head = None
        return job


def run_one(decoder: BatchDecoder, job: Job, prefilled: Prefilled | None = None) -> DecodeResult:
    """Decode one job in a batch of its own; its error, if it fails, is raised."""
    if prefilled is not None:
        decoder.share_prefill(job, prefilled)
    t0 = time.perf_counter()
    outcome = next(iter(decoder.run([job])))
    if outcome.error is not None:
        raise outcome.error
    assert outcome.result is not None
    outcome.result.wall_s = time.perf_counter() - t0
    return outcome.result
