"""An offload iteration's figures from its CUDA events (``Offload.iterations()``), resolved
lazily: waiting for the events is done when the figures are asked for."""

import torch


def resolve(rec):
    """Turns an iteration's timing events into ``compute_wait_s`` (waits for the
    events: done lazily, when the figures are asked for)."""
    waits = rec.pop("_waits", None)
    if waits is not None:
        total = 0.0
        for a, b in waits:
            b.synchronize()
            total += a.elapsed_time(b) / 1e3
        rec["compute_wait_s"] = total
        rec["waits"] = len(waits)
    marks = rec.pop("_marks", None)
    if marks is not None:
        # GPU time of the step (this iteration's first block to the next one's, or
        # the flush), of the blocks' forward, and between the forward's end and
        # backward's arrival at the last block (the head, the loss, their backward).
        def span(a, b):
            if a in marks and b in marks:
                marks[b].synchronize()
                return marks[a].elapsed_time(marks[b]) / 1e3
            return None
        rec["gpu_step_s"] = span("start", "end")
        rec["fwd_s"] = span("start", "fwd_end")
        rec["head_s"] = span("fwd_end", "bwd_start")
        # Backward through the blocks (to the first block's last gradient), and the
        # rest of the step after it (what precedes the first block, the optimizer).
        rec["bwd_s"] = span("bwd_start", "bwd_end")
        rec["tail_s"] = span("bwd_end", "end")
    return rec


def watch_backward_end(off, block):
    """Marks ``bwd_end`` on ``off`` each time a gradient of ``block``'s parameters is
    accumulated (the last one of an iteration wins: backward has left the blocks).
    Returns the hook handles (none when the block has no trainable parameter)."""
    def done(_p):
        if off.started:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            off.marks["bwd_end"] = e
    return [p.register_post_accumulate_grad_hook(done)
            for p in block.parameters() if p.requires_grad]
