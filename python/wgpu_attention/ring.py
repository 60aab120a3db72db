"""Ring attention over ``torch.distributed``: every rank holds a shard of the sequence
(its queries, keys and values) and its own :class:`wgpu_attention.Context`; the K/V
shards travel around the ring (rank r sends to r + 1 and receives from r - 1, P - 1
steps, with ``batch_isend_irecv`` so the transfer runs while the rank attends to the
block it holds), and each rank merges the partial attentions of its queries by their
log-sum-exp (:func:`wgpu_attention.merge_attentions`) as the blocks arrive.

Sharding (:func:`chunks_of`): the sequence of length L is cut into equal chunks. In the
``"contiguous"`` order rank r holds chunk r of P. Under a causal mask that leaves rank
P - 1 with P blocks to attend to and rank 0 with one, so the ``"zigzag"`` order (the
usual load balancing, as in ring-flash-attn and Llama 3's context parallelism) cuts the
sequence into 2P chunks and gives rank r chunks r and 2P - 1 - r: every rank then does
the same work at every step. Attention runs per pair of (query chunk, key chunk), each
call placed on the global axis by ``position_offset`` (queries of chunk a against keys
of chunk b, chunk length C: ``(a - b) * C``), so the causal mask, windows and ALiBi hold
as on the whole sequence. Pairs no query of which can see a key (a causal chunk in the
queries' future, a chunk outside the window) are skipped: their partial would have an
lse of -inf and add nothing.

The backward (:func:`ring_attention_backward`) takes the same ring: each K/V block
travels with float32 accumulators of its dK and dV; every rank adds the gradients of its
queries' pairs with the block (:func:`wgpu_attention.sdpa_backward` with the forward's
final output and log-sum-exp, which makes each pair's gradients exact parts of the
whole), keeps dQ, and passes the block on; after P transfers every block is home with
its gradients summed over all ranks. Unlike the forward, a step's transfer waits for
its gradients, so communication does not overlap the work.

Self-attention only (queries and keys on one axis, ``Lq == Lk``), arrays of shape
``(B, H, L_local, E)`` float32 or float16. Needs torch (for ``torch.distributed``); the
rest of the package does not.
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
    if order == "contiguous":
        return [rank], world
    if order == "zigzag":
        return [rank, 2 * world - 1 - rank], 2 * world
    raise ValueError(f"invalid order: {order!r} is not one of {ORDERS}")


def shard(x, rank, world, order="contiguous"):
    """Rank ``rank``'s shard of ``x`` (``(..., L, E)``): its chunks along the sequence
    axis (-2), concatenated in order."""
    chunks, n = chunks_of(rank, world, order)
    length = x.shape[-2]
    if length % n:
        raise ValueError(f"invalid sequence length: {length} is not a multiple of {n} chunks ({order}, {world} ranks)")
    c = length // n
    return np.ascontiguousarray(np.concatenate([x[..., a * c:(a + 1) * c, :] for a in chunks], axis=-2))


def unshard(shards, order="contiguous"):
    """The whole sequence from every rank's shard (``shards[r]`` rank r's), the inverse
    of :func:`shard`."""
    world = len(shards)
    _, n = chunks_of(0, world, order)
    c = shards[0].shape[-2] // len(chunks_of(0, world, order)[0])
    pieces = [None] * n
    for rank, s in enumerate(shards):
        for i, a in enumerate(chunks_of(rank, world, order)[0]):
            pieces[a] = s[..., i * c:(i + 1) * c, :]
    return np.concatenate(pieces, axis=-2)


def _visible(a, b, c, is_causal, window):
    """Whether any query of chunk a may see any key of chunk b (chunk length c)."""
    q_first, q_last = a * c, a * c + c - 1
    k_first, k_last = b * c, b * c + c - 1
    if is_causal and k_first > q_last:
        return False
    if window is not None:
        left, right = window
        if left is not None and left >= 0 and k_last < q_first - left:
            return False
        if right is not None and right >= 0 and k_first > q_last + right:
            return False
    return True


def _ring(q, k, order, group):
    """This rank's place in the ring: (world, rank, its chunks, the chunk length, the
    global ranks it sends to and receives from), after checking the shards' rows."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    mine, _ = chunks_of(rank, world, order)
    if q.shape[-2] != k.shape[-2] or q.shape[-2] % len(mine):
        raise ValueError(f"invalid shards: q has {q.shape[-2]} rows and k {k.shape[-2]}; self-attention shards "
                         f"hold the same rows, {len(mine)} equal chunks each ({order})")
    send_to, recv_from = (rank + 1) % world, (rank - 1) % world
    global_send = dist.get_global_rank(group, send_to) if group is not None else send_to
    global_recv = dist.get_global_rank(group, recv_from) if group is not None else recv_from
    return world, rank, mine, q.shape[-2] // len(mine), global_send, global_recv


def ring_attention(q, k, v, *, is_causal=False, scale=None, window=None, alibi_slopes=None, softcap=None,
                   order="contiguous", group=None, context=None, stats=None):
    """Attention of this rank's queries over the whole sequence, whose shards every
    rank of ``group`` holds (call it on every rank at once).

    Args:
        q, k, v: this rank's shard, ``(B, H, L_local, E)`` (``E`` of v may differ; q and
            k may have different head counts for GQA: Hq a multiple of Hkv), float32 or
            float16, as :func:`shard` cuts it in ``order``; the same shapes on every rank.
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
    world, rank, mine, c, global_send, global_recv = _ring(q, k, order, group)
    per = len(mine)
    kw = dict(scale=scale, window=window, alibi_slopes=alibi_slopes, softcap=softcap,
              enable_gqa=q.shape[-3] != k.shape[-3], context=context, return_lse=True)
    # K and V travel together in one flat buffer (one message per step).
    k = np.ascontiguousarray(k)
    v = np.ascontiguousarray(v)
    k_shape, v_shape = k.shape, v.shape
    block = torch.from_numpy(np.concatenate([k.ravel(), v.ravel()]))
    incoming = torch.empty_like(block)
    state = [None] * per  # per query chunk: (out, lse), merged as partials arrive
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
        owner = (rank - step) % world
        theirs, _ = chunks_of(owner, world, order)
        flat = block.numpy()
        kb = flat[:k.size].reshape(k_shape)
        vb = flat[k.size:].reshape(v_shape)
        for i, a in enumerate(mine):
            qa = q[..., i * c:(i + 1) * c, :]
            for j, b in enumerate(theirs):
                if not _visible(a, b, c, is_causal, window):
                    skipped += 1
                    continue
                calls += 1
                out, lse = _native.scaled_dot_product_attention(
                    qa, kb[..., j * c:(j + 1) * c, :], vb[..., j * c:(j + 1) * c, :], is_causal=is_causal,
                    position_offset=(a - b) * c, **kw)
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
    for i in range(per):
        if state[i] is None:  # no key visible to any row of this chunk
            out_shape = q.shape[:-2] + (c, v.shape[-1])
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
    world, rank, mine, c, global_send, global_recv = _ring(q, k, order, group)
    kw = dict(scale=scale, window=window, alibi_slopes=alibi_slopes, softcap=softcap,
              enable_gqa=q.shape[-3] != k.shape[-3], context=context)
    # The block: K, V and their gradients' accumulators, float32 in one flat buffer
    # (f16 values are exact in f32 and go back to f16 for the calls).
    k32 = np.ascontiguousarray(k, dtype=np.float32)
    v32 = np.ascontiguousarray(v, dtype=np.float32)
    sizes = [k32.size, v32.size, k32.size, v32.size]

    def parts(buffer):
        # K, V, dK, dV: views of the buffer, so adding into dK and dV writes it.
        flat = np.split(buffer.numpy(), np.cumsum(sizes)[:-1])
        return [part.reshape(shape) for part, shape in zip(flat, [k.shape, v.shape, k.shape, v.shape])]

    block = torch.from_numpy(np.concatenate([k32.ravel(), v32.ravel(), np.zeros(k32.size + v32.size, np.float32)]))
    incoming = torch.empty_like(block)
    dq = np.zeros(q.shape, np.float32)
    comm = attend = 0.0
    calls = skipped = 0
    for step in range(world):
        t0 = time.perf_counter()
        owner = (rank - step) % world
        theirs, _ = chunks_of(owner, world, order)
        kb, vb, dkb, dvb = parts(block)
        for i, a in enumerate(mine):
            rows = slice(i * c, (i + 1) * c)
            for j, b in enumerate(theirs):
                if not _visible(a, b, c, is_causal, window):
                    skipped += 1
                    continue
                calls += 1
                keys = slice(j * c, (j + 1) * c)
                dq_p, dk_p, dv_p = _native.sdpa_backward(
                    q[..., rows, :], kb[..., keys, :].astype(k.dtype), vb[..., keys, :].astype(v.dtype),
                    out[..., rows, :], lse[..., rows], d_out[..., rows, :], is_causal=is_causal,
                    position_offset=(a - b) * c, **kw)
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
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
