"""Ring attention over ``torch.distributed``: every rank holds a shard of the sequence
(its queries, keys and values) and its own :class:`wgpu_attention.Context`; the K/V
shards travel around the ring (rank r sends to r + 1 and receives from r - 1, P - 1
steps, with ``batch_isend_irecv`` so the transfer runs while the rank attends to the
block it holds), and each rank merges the partial attentions of its queries by their
log-sum-exp (:func:`wgpu_attention.merge_attentions`) as the blocks arrive.

Sharding (:func:`chunks_of`): the sequence of length L is cut into chunks whose lengths
differ by at most one row (as ``np.array_split`` cuts it). In the ``"contiguous"`` order
rank r holds chunk r of P. Under a causal mask that leaves rank P - 1 with P blocks to
attend to and rank 0 with one, so the ``"zigzag"`` order (the usual load balancing, as
in ring-flash-attn and Llama 3's context parallelism) cuts the sequence into 2P chunks
and gives rank r chunks r and 2P - 1 - r: every rank then does the same work at every
step. Attention runs per pair of (query chunk, key chunk), each call placed on the
global axis by ``position_offset`` (queries of a chunk starting at global row s_a
against keys of one starting at s_b: ``s_a - s_b``), so the causal mask, windows and
ALiBi hold as on the whole sequence. Pairs no query of which can see a key (a causal
chunk in the queries' future, a chunk outside the window) are skipped: their partial
would have an lse of -inf and add nothing.

Shards may differ in length: contiguous shards of any cut (rank r the r-th piece), and
zigzag ones as :func:`shard` cuts them. Each call first exchanges every rank's shard
length (one ``all_gather``, which also checks that the shards agree in every other
size, so a bad shard is an error on every rank rather than a hang), and the K/V blocks
travel padded to the longest shard, so every message has one size (gloo aborts on
mismatched ones); a rank reads only the owner's rows. At world size 1 the whole
sequence is local: each function is one plain call, with no collectives.

The backward (:func:`ring_attention_backward`) takes the same ring: each K/V block
travels with float32 accumulators of its dK and dV; every rank adds the gradients of its
queries' pairs with the block (:func:`wgpu_attention.sdpa_backward` with the forward's
final output and log-sum-exp, which makes each pair's gradients exact parts of the
whole), keeps dQ, and passes the block on; after P transfers every block is home with
its gradients summed over all ranks. Unlike the forward, a step's transfer waits for
its gradients, so communication does not overlap the work.

Self-attention only (queries and keys on one axis, ``Lq == Lk`` on every rank), arrays
of shape ``(B, H, L_local, E)`` float32 or float16. Needs torch (for
``torch.distributed``); the rest of the package does not.
"""

import time

import numpy as np
import torch
import torch.distributed as dist

from . import _native

__all__ = ["chunks_of", "shard", "unshard", "ring_attention", "ring_attention_backward"]

ORDERS = ("contiguous", "zigzag")


def chunks_of(rank, world, order="contiguous"):
    """The global chunk indices rank ``rank`` of ``world`` holds, in order, and how
    many chunks the sequence is cut into."""
    if order not in ORDERS:
        raise ValueError(f"invalid order: {order!r} is not one of {ORDERS}")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"invalid rank: {rank} of world size {world} (0 <= rank < world size, world size >= 1)")
    if order == "contiguous":
        return [rank], world
    return [rank, 2 * world - 1 - rank], 2 * world


def _cut(length, n):
    """Where n chunks of a sequence of ``length`` rows start, and the end: chunk lengths
    differ by at most one row, the longer first (``np.array_split``'s cut)."""
    sizes = [length // n + (a < length % n) for a in range(n)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()


def shard(x, rank, world, order="contiguous"):
    """Rank ``rank``'s shard of ``x`` (``(..., L, E)``): its chunks along the sequence
    axis (-2), concatenated in order. Chunks differ in length by at most one row where
    L does not divide evenly."""
    chunks, n = chunks_of(rank, world, order)
    starts = _cut(x.shape[-2], n)
    return np.ascontiguousarray(np.concatenate([x[..., starts[a]:starts[a + 1], :] for a in chunks], axis=-2))


def _layout(lengths, order):
    """Every rank's chunks, in the order its shard holds them, as (global start, rows,
    first row in the shard), from every rank's shard length. Contiguous shards may be
    any cut; zigzag ones must be :func:`shard`'s."""
    world = len(lengths)
    if order == "contiguous":
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int).tolist()
        return [[(starts[r], lengths[r], 0)] for r in range(world)]
    chunks = [chunks_of(r, world, order)[0] for r in range(world)]
    starts = _cut(sum(lengths), 2 * world)
    layout = []
    for r in range(world):
        rows = [starts[a + 1] - starts[a] for a in chunks[r]]
        if sum(rows) != lengths[r]:
            raise ValueError(f"invalid shards: rank {r} holds {lengths[r]} rows, but the zigzag cut of "
                             f"{sum(lengths)} rows (wgpu_attention.ring.shard) gives it {sum(rows)}")
        layout.append([(starts[a], n, first) for a, n, first in zip(chunks[r], rows, [0, rows[0]])])
    return layout


def unshard(shards, order="contiguous"):
    """The whole sequence from every rank's shard (``shards[r]`` rank r's), the inverse
    of :func:`shard` (shards of any lengths in the contiguous order)."""
    layout = _layout([s.shape[-2] for s in shards], order)
    pieces = [(start, s[..., first:first + n, :]) for s, chunks in zip(shards, layout) for start, n, first in chunks]
    return np.concatenate([p for _, p in sorted(pieces, key=lambda p: p[0])], axis=-2)


def _visible(q_start, q_rows, k_start, k_rows, is_causal, window):
    """Whether any query of a chunk (global rows from q_start) may see any key of
    another (from k_start); never where either is empty."""
    if q_rows == 0 or k_rows == 0:
        return False
    q_first, q_last = q_start, q_start + q_rows - 1
    k_first, k_last = k_start, k_start + k_rows - 1
    if is_causal and k_first > q_last:
        return False
    if window is not None:
        left, right = window
        if left is not None and left >= 0 and k_last < q_first - left:
            return False
        if right is not None and right >= 0 and k_first > q_last + right:
            return False
    return True


def _problem(q, k, v):
    """Why these shards cannot take part in a ring (checked before any message, so a
    bad shard is an error on every rank rather than a hang or an abort), or None."""
    if any(getattr(x, "ndim", None) != 4 for x in (q, k, v)):
        return "q, k and v must be 4-D arrays (B, H, L_local, E)"
    if q.dtype not in (np.float32, np.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k and v take one dtype, float32 or float16; got {q.dtype}, {k.dtype}, {v.dtype}"
    if not q.shape[-2] == k.shape[-2] == v.shape[-2]:
        return (f"q has {q.shape[-2]} rows, k {k.shape[-2]} and v {v.shape[-2]}; self-attention shards hold "
                "the same rows")
    if q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] or q.shape[-1] != k.shape[-1] or \
            k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return (f"shapes q {q.shape}, k {k.shape}, v {v.shape} do not match: one batch, q and k one head "
                "dim, k and v one head count, q's heads a multiple of it")
    return None


def _lengths(q, k, v, group):
    """Every rank's shard length, exchanged with one ``all_gather`` (none at world size
    1), after checking that every rank's shards are valid and agree in all but length."""
    world = dist.get_world_size(group)
    problem = _problem(q, k, v)
    if world == 1:
        if problem:
            raise ValueError(f"invalid shards: {problem}")
        return [q.shape[-2]]
    sizes = [0] * 7 if problem else [q.shape[-2], *q.shape[:2], q.shape[-1], k.shape[1], v.shape[-1],
                                     q.dtype == np.float16]
    mine = torch.tensor([problem is None, *sizes], dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    everyone = [e.tolist() for e in everyone]
    if problem:
        raise ValueError(f"invalid shards: {problem}")
    bad = [r for r, e in enumerate(everyone) if not e[0]]
    if bad:
        raise ValueError(f"invalid shards on rank(s) {bad} (see their errors); the ring needs every rank's")
    ours = everyone[dist.get_rank(group)]
    differ = [r for r, e in enumerate(everyone) if e[2:] != ours[2:]]
    if differ:
        raise ValueError(f"invalid shards: rank(s) {differ} differ from this rank's in (B, H, E, Hkv, Ev, dtype); "
                         "shards may differ only in length")
    return [e[1] for e in everyone]


def _neighbours(group):
    """The global ranks this rank sends to (r + 1) and receives from (r - 1)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    send_to, recv_from = (rank + 1) % world, (rank - 1) % world
    if group is not None:
        return dist.get_global_rank(group, send_to), dist.get_global_rank(group, recv_from)
    return send_to, recv_from


def _padded(x, rows, dtype=None):
    """``x`` (B, H, L, E) with zero rows appended up to ``rows``, C order."""
    out = np.zeros(x.shape[:-2] + (rows, x.shape[-1]), dtype or x.dtype)
    out[..., :x.shape[-2], :] = x
    return out


def ring_attention(q, k, v, *, is_causal=False, scale=None, window=None, alibi_slopes=None, softcap=None,
                   order="contiguous", group=None, context=None, stats=None):
    """Attention of this rank's queries over the whole sequence, whose shards every
    rank of ``group`` holds (call it on every rank at once).

    Args:
        q, k, v: this rank's shard, ``(B, H, L_local, E)`` (``E`` of v may differ; q and
            k may have different head counts for GQA: Hq a multiple of Hkv), float32 or
            float16, as :func:`shard` cuts it in ``order`` (contiguous shards may be any
            cut, e.g. ``np.array_split``'s); the same shapes on every rank but L_local.
        is_causal, scale, window, alibi_slopes, softcap: as
            :func:`wgpu_attention.scaled_dot_product_attention`, on the global sequence
            (query i sees key j <= i under ``is_causal``).
        order: ``"contiguous"`` or ``"zigzag"`` (see the module's docstring).
        group: the ``torch.distributed`` process group; default the world.
        context: this rank's ``Context``; default ``default_context()``.
        stats: a dict to fill with ``"communication_s"`` (time inside the send/recv
            posts and waits), ``"attention_s"`` (the attention calls and merges),
            ``"calls"`` and ``"skipped"`` (pairs of chunks attended and skipped).

    Returns:
        ``(out, lse)``: this rank's output ``(B, H, L_local, Ev)`` in the inputs' dtype
        and its log-sum-exp ``(B, H, L_local)`` float32.
    """
    chunks_of(0, 1, order)  # checks the order's name
    lengths = _lengths(q, k, v, group)
    kw = dict(scale=scale, window=window, alibi_slopes=alibi_slopes, softcap=softcap,
              enable_gqa=q.shape[-3] != k.shape[-3], context=context, return_lse=True)
    if len(lengths) == 1:  # the whole sequence is here: one call, no collectives
        t0 = time.perf_counter()
        out, lse = _native.scaled_dot_product_attention(q, k, v, is_causal=is_causal, **kw)
        if stats is not None:
            stats.update(communication_s=0.0, attention_s=time.perf_counter() - t0, calls=1, skipped=0)
        return out, lse
    world, rank = len(lengths), dist.get_rank(group)
    layout = _layout(lengths, order)
    global_send, global_recv = _neighbours(group)
    # K and V travel together in one flat buffer (one message per step), padded to the
    # longest shard's rows so that every rank's message has the same size.
    longest = max(max(lengths), 1)
    kp, vp = _padded(k, longest), _padded(v, longest)
    block = torch.from_numpy(np.concatenate([kp.ravel(), vp.ravel()]))
    incoming = torch.empty_like(block)
    mine = layout[rank]
    state = [None] * len(mine)  # per query chunk: (out, lse), merged as partials arrive
    comm = attend = 0.0
    calls = skipped = 0
    for step in range(world):
        t0 = time.perf_counter()
        requests = []
        if step < world - 1:
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, block, global_send, group),
                dist.P2POp(dist.irecv, incoming, global_recv, group),
            ])
        t1 = time.perf_counter()
        comm += t1 - t0
        flat = block.numpy()
        kb = flat[:kp.size].reshape(kp.shape)
        vb = flat[kp.size:].reshape(vp.shape)
        for i, (q_start, q_rows, q_first) in enumerate(mine):
            qa = q[..., q_first:q_first + q_rows, :]
            for k_start, k_rows, k_first in layout[(rank - step) % world]:
                if not _visible(q_start, q_rows, k_start, k_rows, is_causal, window):
                    skipped += 1
                    continue
                calls += 1
                keys = slice(k_first, k_first + k_rows)  # the owner's rows, not the padding
                out, lse = _native.scaled_dot_product_attention(
                    qa, kb[..., keys, :], vb[..., keys, :], is_causal=is_causal,
                    position_offset=q_start - k_start, **kw)
                if state[i] is None:
                    state[i] = (out, lse)
                else:
                    state[i] = _native.merge_attentions([state[i][0], out], [state[i][1], lse], context=context)
        t2 = time.perf_counter()
        attend += t2 - t1
        for request in requests:
            request.wait()
        if requests:
            block, incoming = incoming, block
        comm += time.perf_counter() - t2
    outs, lses = [], []
    for i, (_, q_rows, _) in enumerate(mine):
        if state[i] is None:  # no key visible to any row of this chunk (or no rows)
            out_shape = q.shape[:-2] + (q_rows, v.shape[-1])
            state[i] = (np.zeros(out_shape, dtype=q.dtype), np.full(out_shape[:-1], -np.inf, dtype=np.float32))
        outs.append(state[i][0])
        lses.append(state[i][1])
    if stats is not None:
        stats.update(communication_s=comm, attention_s=attend, calls=calls, skipped=skipped)
    return np.concatenate(outs, axis=-2), np.concatenate(lses, axis=-1)


def ring_attention_backward(q, k, v, out, lse, d_out, *, is_causal=False, scale=None, window=None,
                            alibi_slopes=None, softcap=None, order="contiguous", group=None, context=None,
                            stats=None):
    """The gradients of :func:`ring_attention` with respect to this rank's shards of q,
    k and v (call it on every rank at once, with the same options as the forward).

    Args:
        q, k, v: this rank's shard, as given to :func:`ring_attention`.
        out, lse: what :func:`ring_attention` returned on this rank.
        d_out: the gradient of ``out``, its shape and dtype.
        is_causal, scale, window, alibi_slopes, softcap, order, group, context: as
            :func:`ring_attention`.
        stats: a dict to fill with ``"communication_s"``, ``"attention_s"``, ``"calls"``
            and ``"skipped"``, as the forward's.

    Returns:
        ``(dq, dk, dv)``: this rank's shards of the gradients, each its input's shape and
        dtype (accumulated in float32).
    """
    chunks_of(0, 1, order)  # checks the order's name
    lengths = _lengths(q, k, v, group)
    kw = dict(scale=scale, window=window, alibi_slopes=alibi_slopes, softcap=softcap,
              enable_gqa=q.shape[-3] != k.shape[-3], context=context)
    if len(lengths) == 1:  # the whole sequence is here: one call, no collectives
        t0 = time.perf_counter()
        grads = _native.sdpa_backward(q, k, v, out, lse, d_out, is_causal=is_causal, **kw)
        if stats is not None:
            stats.update(communication_s=0.0, attention_s=time.perf_counter() - t0, calls=1, skipped=0)
        return grads
    world, rank = len(lengths), dist.get_rank(group)
    layout = _layout(lengths, order)
    global_send, global_recv = _neighbours(group)
    # The block: K, V and their gradients' accumulators, float32 in one flat buffer
    # (f16 values are exact in f32 and go back to f16 for the calls), padded to the
    # longest shard's rows as the forward's.
    longest = max(max(lengths), 1)
    kp, vp = _padded(k, longest, np.float32), _padded(v, longest, np.float32)
    sizes = [kp.size, vp.size, kp.size, vp.size]

    def parts(buffer):
        # K, V, dK, dV: views of the buffer, so adding into dK and dV writes it.
        flat = np.split(buffer.numpy(), np.cumsum(sizes)[:-1])
        return [part.reshape(shape) for part, shape in zip(flat, [kp.shape, vp.shape, kp.shape, vp.shape])]

    block = torch.from_numpy(np.concatenate([kp.ravel(), vp.ravel(), np.zeros(kp.size + vp.size, np.float32)]))
    incoming = torch.empty_like(block)
    dq = np.zeros(q.shape, np.float32)
    comm = attend = 0.0
    calls = skipped = 0
    for step in range(world):
        t0 = time.perf_counter()
        kb, vb, dkb, dvb = parts(block)
        for q_start, q_rows, q_first in layout[rank]:
            rows = slice(q_first, q_first + q_rows)
            for k_start, k_rows, k_first in layout[(rank - step) % world]:
                if not _visible(q_start, q_rows, k_start, k_rows, is_causal, window):
                    skipped += 1
                    continue
                calls += 1
                keys = slice(k_first, k_first + k_rows)
                dq_p, dk_p, dv_p = _native.sdpa_backward(
                    q[..., rows, :], kb[..., keys, :].astype(k.dtype), vb[..., keys, :].astype(v.dtype),
                    out[..., rows, :], lse[..., rows], d_out[..., rows, :], is_causal=is_causal,
                    position_offset=q_start - k_start, **kw)
                dq[..., rows, :] += dq_p
                dkb[..., keys, :] += dk_p
                dvb[..., keys, :] += dv_p
        t1 = time.perf_counter()
        attend += t1 - t0
        # Every step passes the block on, the last one home to its owner.
        for request in dist.batch_isend_irecv([
            dist.P2POp(dist.isend, block, global_send, group),
            dist.P2POp(dist.irecv, incoming, global_recv, group),
        ]):
            request.wait()
        block, incoming = incoming, block
        comm += time.perf_counter() - t1
    if stats is not None:
        stats.update(communication_s=comm, attention_s=attend, calls=calls, skipped=skipped)
    _, _, dk, dv = parts(block)
    mine = slice(0, lengths[rank])  # this rank's rows, without the padding
    return dq.astype(q.dtype), dk[..., mine, :].astype(k.dtype), dv[..., mine, :].astype(v.dtype)
