"""Workload recipes for the trace corpus (scripts/corpus/record.py records one of them).

Each recipe builds a model with random weights (nothing is downloaded) and returns a
`Job`: `make_batch(rng)` makes one iteration's inputs on the GPU, `step(batch)` runs one
iteration (forward, backward and optimizer step for training; one `generate` call for
generation). A dynamic recipe draws its shapes from `rng` (seeded, so the native and the
expandable-segments runs of a recipe see the same shapes in the same order).

`RECIPES` maps a name to (family, split, dynamic, description, builder). The split is by
family: every recipe of a family is in the same split, so a test family is never seen
while a constant is chosen or a shipped model is trained.
"""

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

# Family -> split. The bundled traces' families (resnet, mobilenet, gpt2, bert) are in
# train: every constant chosen so far was chosen with them in view.
SPLITS = {
    "resnet": "train", "mobilenet": "train", "gpt2": "train", "bert": "train",
    "vgg": "train", "densenet": "train", "t5": "train",
    "efficientnet": "validation", "convnext": "validation", "regnet": "validation",
    "segmentation": "validation",
    "vit": "test", "swin": "test", "llama": "test", "moe": "test", "unet": "test",
    "gnn": "test", "speech": "test", "detection": "test",
    # Generation of two more decoder families, recorded apart from the corpus
    # (training-data/corpus/generation/): held out like the test split.
    "opt": "test", "gptneox": "test",
}

DEV = "cuda"
# Set by record.py --dry-run: batches of at most 2, on the CPU (checks a recipe builds).
DRY = False


@dataclass
class Job:
    make_batch: Callable
    step: Callable
    # Whether make_batch may run on a side stream (inputs prefetched there).
    side_stream: bool = False


def run_iteration(job, side, rng):
    """One iteration of `job`: its batch made on the side stream `side` if given (and
    handed to the compute stream with `record_stream`, as an input prefetcher does),
    else on the compute stream; then its step."""
    if side is not None:
        with torch.cuda.stream(side):
            batch = job.make_batch(rng)
        torch.cuda.current_stream().wait_stream(side)
        for t in flat_tensors(batch):
            t.record_stream(torch.cuda.current_stream())
    else:
        batch = job.make_batch(rng)
    job.step(batch)
    del batch


def flat_tensors(x):
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from flat_tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from flat_tensors(v)


def bs(n):
    return min(n, 2) if DRY else n


def autocast(bf16):
    if bf16:
        return torch.autocast(device_type="cuda" if not DRY else "cpu", dtype=torch.bfloat16)
    return torch.autocast(device_type="cuda" if not DRY else "cpu", enabled=False)


def optimizer(params, kind, lr=1e-4):
    params = [p for p in params if p.requires_grad]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.AdamW(params, lr=lr)


def train_step(model, opt, loss_fn, bf16):
    def step(batch):
        with autocast(bf16):
            loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


# ---------------------------------------------------------------- vision classifiers


def vision(ctor, batch, opt="sgd", bf16=False, sizes=(224,), ckpt=False, classes=1000,
           side=False):
    def build():
        model = ctor().to(DEV)
        if ckpt:
            checkpoint_children(model)
        o = optimizer(model.parameters(), opt)

        def make(rng):
            s = sizes[rng.randrange(len(sizes))]
            x = torch.randn(bs(batch), 3, s, s, device=DEV)
            y = torch.randint(0, classes, (bs(batch),), device=DEV)
            return x, y

        def loss(m, b):
            out = m(b[0])
            if isinstance(out, dict):
                out = out["out"]
            return F.cross_entropy(out, b[1])
        return Job(make, train_step(model, o, loss, bf16), side_stream=side)
    return build


def checkpoint_children(model):
    """Wraps the model's largest sequential stages in activation checkpointing."""
    from torch.utils.checkpoint import checkpoint

    stages = [m for m in model.modules() if isinstance(m, nn.Sequential) and len(m) >= 2]
    # The outermost sequentials that hold most of the compute.
    top = []
    for m in stages:
        if not any(m is not t and any(m is c for c in t.modules()) for t in stages):
            top.append(m)
    for seq in top:
        for i, child in enumerate(list(seq)):
            seq[i] = Ckpt(child, checkpoint)


class Ckpt(nn.Module):
    def __init__(self, inner, fn):
        super().__init__()
        self.inner = inner
        self.fn = fn

    def forward(self, x):
        if self.training:
            return self.fn(self.inner, x, use_reentrant=False)
        return self.inner(x)


def tv(name, **kw):
    import torchvision

    return lambda: getattr(torchvision.models, name)(weights=None, **kw)


def timm_model(name):
    import timm

    return lambda: timm.create_model(name, pretrained=False)


def segmentation(name, batch, sizes=(512,), bf16=False):
    def build():
        import torchvision

        model = getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None, num_classes=21, aux_loss=True).to(DEV)
        o = optimizer(model.parameters(), "sgd")

        def make(rng):
            s = sizes[rng.randrange(len(sizes))]
            x = torch.randn(bs(batch), 3, s, s, device=DEV)
            y = torch.randint(0, 21, (bs(batch), s, s), device=DEV)
            return x, y

        def loss(m, b):
            out = m(b[0])
            return F.cross_entropy(out["out"], b[1]) + 0.4 * F.cross_entropy(out["aux"], b[1])
        return Job(make, train_step(model, o, loss, bf16))
    return build


def detection(name, batch, size=(480, 640)):
    def build():
        import torchvision

        model = getattr(torchvision.models.detection, name)(
            weights=None, weights_backbone=None, num_classes=91).to(DEV)
        o = optimizer(model.parameters(), "sgd")

        def make(rng):
            imgs, targets = [], []
            for _ in range(bs(batch)):
                h = size[0] + 32 * rng.randrange(4)
                w = size[1] + 32 * rng.randrange(4)
                imgs.append(torch.rand(3, h, w, device=DEV))
                n = rng.randrange(1, 12)
                xy = torch.rand(n, 2, device=DEV) * torch.tensor([w * 0.7, h * 0.7], device=DEV)
                wh = torch.rand(n, 2, device=DEV) * 100 + 16
                boxes = torch.cat([xy, xy + wh], 1)
                labels = torch.randint(1, 91, (n,), device=DEV)
                targets.append({"boxes": boxes, "labels": labels})
            return imgs, targets

        def loss(m, b):
            return sum(m(b[0], b[1]).values())
        return Job(make, train_step(model, o, loss, False))
    return build


# ---------------------------------------------------------------- language models


def hf_causal(cfg_fn, batch, seqs, opt="adamw", bf16=True, ckpt=False, lora=None,
              side=False):
    def build():
        model = cfg_fn().to(DEV)
        if ckpt:
            model.gradient_checkpointing_enable()
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.05, target_modules=lora,
                task_type="CAUSAL_LM"))
        model.train()
        o = optimizer(model.parameters(), opt)
        vocab = model.config.vocab_size

        def make(rng):
            b = batch[rng.randrange(len(batch))]
            s = seqs[rng.randrange(len(seqs))]
            return torch.randint(0, vocab, (bs(b), s), device=DEV)

        def loss(m, ids):
            return m(input_ids=ids, labels=ids).loss
        return Job(make, train_step(model, o, loss, bf16), side_stream=side)
    return build


def hf_generate(cfg_fn, batches, prompts, new_tokens, bf16=True):
    def build():
        model = cfg_fn().to(DEV).eval()
        if bf16:
            model = model.to(torch.bfloat16)
        vocab = model.config.vocab_size

        def make(rng):
            b = batches[rng.randrange(len(batches))]
            p = prompts[rng.randrange(len(prompts))]
            n = new_tokens[rng.randrange(len(new_tokens))]
            return torch.randint(1, vocab, (bs(b), p), device=DEV), n

        def step(batch):
            ids, n = batch
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=n, min_new_tokens=n, do_sample=False,
                               pad_token_id=0)
        return Job(make, step)
    return build


def gpt2(**over):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(**over))


def opt(**over):
    from transformers import OPTConfig, OPTForCausalLM

    return OPTForCausalLM(OPTConfig(**over))


def gptneox(**over):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    return GPTNeoXForCausalLM(GPTNeoXConfig(**over))


def llama(**over):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
               num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
               max_position_embeddings=4096)
    cfg.update(over)
    return LlamaForCausalLM(LlamaConfig(**cfg))


def mixtral(**over):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = dict(vocab_size=32000, hidden_size=512, intermediate_size=1024,
               num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
               num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096)
    cfg.update(over)
    return MixtralForCausalLM(MixtralConfig(**cfg))


def qwen2_moe(**over):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = dict(vocab_size=32000, hidden_size=512, intermediate_size=1024,
               moe_intermediate_size=256, shared_expert_intermediate_size=512,
               num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
               num_experts=16, num_experts_per_tok=4, max_position_embeddings=4096)
    cfg.update(over)
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(**cfg))


def bert_mlm(batch, seqs, opt="adamw", bf16=False, large=False):
    def build():
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig() if not large else BertConfig(
            hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
            intermediate_size=4096)
        model = BertForMaskedLM(cfg).to(DEV).train()
        o = optimizer(model.parameters(), opt)

        def make(rng):
            b = batch[rng.randrange(len(batch))]
            s = seqs[rng.randrange(len(seqs))]
            ids = torch.randint(0, cfg.vocab_size, (bs(b), s), device=DEV)
            return ids

        def loss(m, ids):
            return m(input_ids=ids, labels=ids).loss
        return Job(make, train_step(model, o, loss, bf16))
    return build


def t5_train(batch, src_lens, tgt_lens, bf16=False):
    def build():
        from transformers import T5Config, T5ForConditionalGeneration

        cfg = T5Config(vocab_size=32128, d_model=512, d_ff=2048, num_layers=6,
                       num_heads=8, decoder_start_token_id=0)
        model = T5ForConditionalGeneration(cfg).to(DEV).train()
        o = optimizer(model.parameters(), "adamw")

        def make(rng):
            s = src_lens[rng.randrange(len(src_lens))]
            t = tgt_lens[rng.randrange(len(tgt_lens))]
            return (torch.randint(0, 32128, (bs(batch), s), device=DEV),
                    torch.randint(0, 32128, (bs(batch), t), device=DEV))

        def loss(m, b):
            return m(input_ids=b[0], labels=b[1]).loss
        return Job(make, train_step(model, o, loss, bf16))
    return build


# ---------------------------------------------------------------- diffusion UNet


class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(temb, cout)
        self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t):
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(t)[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return h + self.skip(x)


class Attn(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n, self.qkv, self.o = nn.GroupNorm(32, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.n(x)).reshape(b, 3, 4, c // 4, h * w).unbind(1)
        a = F.scaled_dot_product_attention(q.transpose(-1, -2), k.transpose(-1, -2),
                                           v.transpose(-1, -2))
        return x + self.o(a.transpose(-1, -2).reshape(b, c, h, w))


class UNet(nn.Module):
    """A DDPM-style UNet: residual blocks, timestep embedding, attention at 1/4 and 1/8."""

    def __init__(self, ch=128, mults=(1, 2, 2, 4), ckpt=False):
        super().__init__()
        self.ckpt = ckpt
        temb = ch * 4
        self.temb = nn.Sequential(nn.Linear(ch, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.ch = ch
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down, self.up = nn.ModuleList(), nn.ModuleList()
        chans, c = [ch], ch
        for i, m in enumerate(mults):
            for _ in range(2):
                self.down.append(nn.ModuleList([ResBlock(c, ch * m, temb),
                                                Attn(ch * m) if i >= 2 else nn.Identity()]))
                c = ch * m
                chans.append(c)
            if i < len(mults) - 1:
                self.down.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                chans.append(c)
        self.mid = nn.ModuleList([ResBlock(c, c, temb), Attn(c), ResBlock(c, c, temb)])
        for i, m in reversed(list(enumerate(mults))):
            for _ in range(3):
                self.up.append(nn.ModuleList([ResBlock(c + chans.pop(), ch * m, temb),
                                              Attn(ch * m) if i >= 2 else nn.Identity()]))
                c = ch * m
            if i > 0:
                self.up.append(nn.Upsample(scale_factor=2))
        self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    def embed(self, t):
        half = self.ch // 2
        f = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
        a = t[:, None].float() * f[None]
        return self.temb(torch.cat([a.sin(), a.cos()], 1))

    def block(self, blk, h, t):
        if self.ckpt and self.training:
            from torch.utils.checkpoint import checkpoint

            return checkpoint(lambda a, b: blk[1](blk[0](a, b)), h, t, use_reentrant=False)
        return blk[1](blk[0](h, t))

    def forward(self, x, t):
        t = self.embed(t)
        h = self.inp(x)
        skips = [h]
        for d in self.down:
            h = self.block(d, h, t) if isinstance(d, nn.ModuleList) else d(h)
            skips.append(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, t)), t)
        for u in self.up:
            if isinstance(u, nn.ModuleList):
                h = self.block(u, torch.cat([h, skips.pop()], 1), t)
            else:
                h = u(h)
        return self.out(h)


def unet(batch, sizes, bf16=False, ckpt=False, ch=128):
    def build():
        model = UNet(ch=ch, ckpt=ckpt).to(DEV).train()
        o = optimizer(model.parameters(), "adamw")

        def make(rng):
            s = sizes[rng.randrange(len(sizes))]
            x0 = torch.randn(bs(batch), 3, s, s, device=DEV)
            t = torch.randint(0, 1000, (bs(batch),), device=DEV)
            return x0, t

        def loss(m, b):
            x0, t = b
            noise = torch.randn_like(x0)
            abar = torch.cos(t.float() / 1000 * math.pi / 2)[:, None, None, None] ** 2
            xt = abar.sqrt() * x0 + (1 - abar).sqrt() * noise
            return F.mse_loss(m(xt, t), noise)
        return Job(make, train_step(model, o, loss, bf16))
    return build


# ---------------------------------------------------------------- graph networks


def gnn(kind, nodes, avg_degree=16, feat=256, hidden=256, layers=3, classes=32):
    def build():
        import torch_geometric.nn as gnn_nn

        conv = {"gcn": lambda i, o: gnn_nn.GCNConv(i, o),
                "gat": lambda i, o: gnn_nn.GATConv(i, o // 4, heads=4),
                "sage": lambda i, o: gnn_nn.SAGEConv(i, o)}[kind]
        dims = [feat] + [hidden] * layers

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = nn.ModuleList(conv(a, b) for a, b in zip(dims, dims[1:]))
                self.head = nn.Linear(hidden, classes)

            def forward(self, x, ei):
                for c in self.convs:
                    x = F.relu(c(x, ei))
                return self.head(x)

        model = Net().to(DEV).train()
        o = optimizer(model.parameters(), "adamw", lr=1e-3)

        def make(rng):
            n = nodes[rng.randrange(len(nodes))]
            n = min(n, 64) if DRY else n
            e = n * avg_degree
            x = torch.randn(n, feat, device=DEV)
            ei = torch.randint(0, n, (2, e), device=DEV)
            y = torch.randint(0, classes, (n,), device=DEV)
            return x, ei, y

        def loss(m, b):
            return F.cross_entropy(m(b[0], b[1]), b[2])
        return Job(make, train_step(model, o, loss, False))
    return build


# ---------------------------------------------------------------- speech


def wav2vec2_ctc(batch, seconds, bf16=False):
    def build():
        import torchaudio

        model = torchaudio.models.wav2vec2_base(aux_num_out=32).to(DEV).train()
        o = optimizer(model.parameters(), "adamw")

        def make(rng):
            s = seconds[rng.randrange(len(seconds))]
            wav = torch.randn(bs(batch), int(16000 * s), device=DEV)
            tgt = torch.randint(1, 32, (bs(batch), int(12 * s)), device=DEV)
            return wav, tgt

        def loss(m, b):
            em, _ = m(b[0])
            lp = em.float().log_softmax(-1).transpose(0, 1)
            n = b[0].shape[0]
            il = torch.full((n,), lp.shape[0], dtype=torch.long, device=DEV)
            tl = torch.full((n,), b[1].shape[1], dtype=torch.long, device=DEV)
            return F.ctc_loss(lp, b[1], il, tl)
        return Job(make, train_step(model, o, loss, bf16))
    return build


def conformer_ctc(batch, frames, bf16=False):
    def build():
        import torchaudio

        enc = torchaudio.models.Conformer(input_dim=256, num_heads=4, ffn_dim=1024,
                                          num_layers=12, depthwise_conv_kernel_size=31)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.front = nn.Sequential(nn.Conv1d(80, 256, 3, stride=2, padding=1),
                                           nn.SiLU())
                self.enc = enc
                self.head = nn.Linear(256, 128)

            def forward(self, feats):
                x = self.front(feats.transpose(1, 2)).transpose(1, 2)
                lengths = torch.full((x.shape[0],), x.shape[1], device=x.device)
                y, _ = self.enc(x, lengths)
                return self.head(y)

        model = Net().to(DEV).train()
        o = optimizer(model.parameters(), "adamw")

        def make(rng):
            t = frames[rng.randrange(len(frames))]
            return (torch.randn(bs(batch), t, 80, device=DEV),
                    torch.randint(1, 128, (bs(batch), t // 8), device=DEV))

        def loss(m, b):
            lp = m(b[0]).float().log_softmax(-1).transpose(0, 1)
            n = b[0].shape[0]
            il = torch.full((n,), lp.shape[0], dtype=torch.long, device=DEV)
            tl = torch.full((n,), b[1].shape[1], dtype=torch.long, device=DEV)
            return F.ctc_loss(lp, b[1], il, tl)
        return Job(make, train_step(model, o, loss, bf16))
    return build


# ---------------------------------------------------------------- the corpus

S, D = False, True
R = {}


def add(name, family, dynamic, desc, builder):
    assert family in SPLITS, family
    R[name] = (family, SPLITS[family], dynamic, desc, builder)


# train families
add("resnet18_b128_sgd", "resnet", S, "torchvision ResNet-18, batch 128, 224px, fp32, SGD",
    vision(tv("resnet18"), 128))
add("resnet50_b64_bf16_adamw", "resnet", S, "ResNet-50, batch 64, 224px, bf16 autocast, AdamW",
    vision(tv("resnet50"), 64, "adamw", True))
add("resnet50_b96_ckpt_sgd", "resnet", S, "ResNet-50, batch 96, 224px, fp32, SGD, activation checkpointing per block",
    vision(tv("resnet50"), 96, ckpt=True))
add("resnet101_b32_2stream_sgd", "resnet", S, "ResNet-101, batch 32, 224px, fp32, SGD, inputs made on a side stream",
    vision(tv("resnet101"), 32, side=True))
add("mobilenet_v2_b128_sgd", "mobilenet", S, "MobileNetV2, batch 128, 224px, fp32, SGD",
    vision(tv("mobilenet_v2"), 128))
add("mobilenet_v3s_b256_bf16_adamw", "mobilenet", S, "MobileNetV3-Small, batch 256, 224px, bf16, AdamW",
    vision(tv("mobilenet_v3_small"), 256, "adamw", True))
add("vgg16_b32_sgd", "vgg", S, "VGG-16, batch 32, 224px, fp32, SGD",
    vision(tv("vgg16"), 32))
add("densenet121_b64_sgd", "densenet", S, "DenseNet-121, batch 64, 224px, fp32, SGD",
    vision(tv("densenet121"), 64))
add("densenet121_multiscale_b32_adamw", "densenet", D, "DenseNet-121, batch 32, image in {160,192,224,256}, fp32, AdamW",
    vision(tv("densenet121"), 32, "adamw", sizes=(160, 192, 224, 256)))
add("gpt2_b4_s1024_fp32_adamw", "gpt2", S, "GPT-2 small, batch 4, seq 1024, fp32, AdamW",
    hf_causal(gpt2, (4,), (1024,), bf16=False))
add("gpt2_b16_s512_bf16_ckpt", "gpt2", S, "GPT-2 small, batch 16, seq 512, bf16, AdamW, gradient checkpointing",
    hf_causal(gpt2, (16,), (512,), ckpt=True))
add("gpt2_dynseq_b8_bf16", "gpt2", D, "GPT-2 small, batch 8, seq in {128,256,512,1024}, bf16, AdamW",
    hf_causal(gpt2, (8,), (128, 256, 512, 1024)))
add("gpt2_lora_b8_s512_bf16", "gpt2", S, "GPT-2 small with LoRA (r=8, c_attn), batch 8, seq 512, bf16, AdamW",
    hf_causal(gpt2, (8,), (512,), lora=["c_attn"]))
add("gpt2_medium_generate_dynamic", "gpt2", D, "GPT-2 medium greedy generation, bf16 weights, batch in {1,8,32}, prompt in {64,256}, new tokens in {32,128}",
    hf_generate(lambda: gpt2(n_embd=1024, n_layer=24, n_head=16), (1, 8, 32), (64, 256), (32, 128)))
add("bert_b16_s512_bf16_adamw", "bert", S, "BERT-base MLM, batch 16, seq 512, bf16, AdamW",
    bert_mlm((16,), (512,), bf16=True))
add("bert_large_dynbatch_s128_sgd", "bert", D, "BERT-large MLM, batch in {8,16,32}, seq 128, fp32, SGD",
    bert_mlm((8, 16, 32), (128,), opt="sgd", large=True))
add("t5_small_dynseq_b32", "t5", D, "T5-small (6+6 layers), batch 32, source in {64,128,256}, target in {16,64}, fp32, AdamW",
    t5_train(32, (64, 128, 256), (16, 64)))
# validation families
add("efficientnet_b0_b64_sgd", "efficientnet", S, "EfficientNet-B0, batch 64, 224px, fp32, SGD",
    vision(tv("efficientnet_b0"), 64))
add("efficientnet_b3_b32_bf16_adamw", "efficientnet", S, "EfficientNet-B3, batch 32, 300px, bf16, AdamW",
    vision(tv("efficientnet_b3"), 32, "adamw", True, sizes=(300,)))
add("convnext_tiny_b64_bf16_adamw", "convnext", S, "ConvNeXt-Tiny, batch 64, 224px, bf16, AdamW",
    vision(tv("convnext_tiny"), 64, "adamw", True))
add("convnext_tiny_multiscale_b32", "convnext", D, "ConvNeXt-Tiny, batch 32, image in {160,224,288}, fp32, AdamW",
    vision(tv("convnext_tiny"), 32, "adamw", sizes=(160, 224, 288)))
add("regnet_y_1_6gf_b64_sgd", "regnet", S, "RegNetY-1.6GF, batch 64, 224px, fp32, SGD",
    vision(tv("regnet_y_1_6gf"), 64))
add("deeplabv3_r50_b8_s512", "segmentation", S, "DeepLabV3-ResNet50 (aux head), batch 8, 512px, 21 classes, fp32, SGD",
    segmentation("deeplabv3_resnet50", 8))
add("fcn_r50_multiscale_b8", "segmentation", D, "FCN-ResNet50 (aux head), batch 8, image in {384,448,512}, fp32, SGD",
    segmentation("fcn_resnet50", 8, sizes=(384, 448, 512)))
# test families
add("vit_b16_b64_bf16_adamw", "vit", S, "ViT-B/16 (torchvision), batch 64, 224px, bf16, AdamW",
    vision(tv("vit_b_16"), 64, "adamw", True))
add("vit_b16_b128_ckpt_bf16", "vit", S, "ViT-B/16, batch 128, 224px, bf16, AdamW, activation checkpointing per encoder block",
    vision(tv("vit_b_16"), 128, "adamw", True, ckpt=True))
add("deit_small_b128_sgd", "vit", S, "DeiT-Small (timm), batch 128, 224px, fp32, SGD",
    vision(timm_model("deit_small_patch16_224"), 128))
add("swin_t_b64_adamw", "swin", S, "Swin-T (torchvision), batch 64, 224px, fp32, AdamW",
    vision(tv("swin_t"), 64, "adamw"))
add("swin_t_b64_2stream_bf16", "swin", S, "Swin-T, batch 64, 224px, bf16, AdamW, inputs made on a side stream",
    vision(tv("swin_t"), 64, "adamw", True, side=True))
add("swin_v2_t_multiscale_b32", "swin", D, "Swin-V2-T, batch 32, image in {192,224,256}, bf16, AdamW",
    vision(tv("swin_v2_t"), 32, "adamw", True, sizes=(192, 224, 256)))
add("llama_b8_s1024_bf16_adamw", "llama", S, "Llama-style decoder (12 layers, 768 wide, GQA 12/4), batch 8, seq 1024, bf16, AdamW",
    hf_causal(llama, (8,), (1024,)))
add("llama_b16_s1024_ckpt_bf16", "llama", S, "Llama-style decoder, batch 16, seq 1024, bf16, AdamW, gradient checkpointing",
    hf_causal(llama, (16,), (1024,), ckpt=True))
add("llama_dynseq_b8_bf16", "llama", D, "Llama-style decoder, batch 8, seq in {256,512,1024,2048}, bf16, AdamW",
    hf_causal(llama, (8,), (256, 512, 1024, 2048)))
add("llama_dynbatch_s512_2stream", "llama", D, "Llama-style decoder, seq 512, batch in {4,8,16}, bf16, AdamW, inputs made on a side stream",
    hf_causal(llama, (4, 8, 16), (512,), side=True))
add("llama_lora_b8_s1024_bf16", "llama", S, "Llama-style decoder with LoRA (r=8, q/v), batch 8, seq 1024, bf16, AdamW",
    hf_causal(llama, (8,), (1024,), lora=["q_proj", "v_proj"]))
add("llama_lora_dynseq_sgd", "llama", D, "Llama-style decoder with LoRA (r=8, q/k/v/o), batch 8, seq in {256,512,1024}, fp32, SGD",
    hf_causal(llama, (8,), (256, 512, 1024), opt="sgd", bf16=False,
              lora=["q_proj", "k_proj", "v_proj", "o_proj"]))
add("llama_generate_dynamic", "llama", D, "Llama-style decoder greedy generation with KV cache, bf16, batch in {1,4,16}, prompt in {32,256,512}, new tokens in {32,128}",
    hf_generate(llama, (1, 4, 16), (32, 256, 512), (32, 128)))
add("mixtral_b8_s512_bf16", "moe", D, "Mixtral-style MoE (6 layers, 8 experts, top-2), batch 8, seq 512, bf16, AdamW (routing varies per iteration)",
    hf_causal(mixtral, (8,), (512,)))
add("mixtral_dynseq_b4_bf16", "moe", D, "Mixtral-style MoE, batch 4, seq in {256,512,1024}, bf16, AdamW",
    hf_causal(mixtral, (4,), (256, 512, 1024)))
add("qwen2moe_b8_s512_bf16", "moe", D, "Qwen2-MoE-style (16 experts, top-4, shared expert), batch 8, seq 512, bf16, AdamW",
    hf_causal(qwen2_moe, (8,), (512,)))
add("unet_b64_64px_adamw", "unet", S, "DDPM UNet (128 ch, attention at 1/4 and 1/8), batch 64, 64px, fp32, AdamW",
    unet(64, (64,)))
add("unet_b16_128px_bf16_ckpt", "unet", S, "DDPM UNet, batch 16, 128px, bf16, AdamW, checkpointed blocks",
    unet(16, (128,), bf16=True, ckpt=True))
add("unet_dynres_b32_bf16", "unet", D, "DDPM UNet, batch 32, image in {32,64,96}, bf16, AdamW",
    unet(32, (32, 64, 96), bf16=True))
add("gcn_fixed_200k", "gnn", S, "3-layer GCN (torch_geometric), one random graph of 200k nodes, degree 16, fp32, AdamW",
    gnn("gcn", (200_000,)))
add("gat_dyngraph", "gnn", D, "3-layer GAT (4 heads), random graphs of {50k,100k,150k} nodes, fp32, AdamW",
    gnn("gat", (50_000, 100_000, 150_000)))
add("sage_dyngraph", "gnn", D, "3-layer GraphSAGE, random graphs of {100k,200k,400k} nodes, fp32, AdamW",
    gnn("sage", (100_000, 200_000, 400_000), avg_degree=8))
add("wav2vec2_dynlen_b8", "speech", D, "wav2vec 2.0 base (torchaudio) with a CTC head, batch 8, audio in {4,8,12,16} s, fp32, AdamW",
    wav2vec2_ctc(8, (4, 8, 12, 16)))
add("conformer_b16_1024f_bf16", "speech", S, "Conformer (12 layers, 256 wide) CTC, batch 16, 1024 frames of 80 mel bins, bf16, AdamW",
    conformer_ctc(16, (1024,), bf16=True))
add("fasterrcnn_mnv3_b8", "detection", D, "Faster R-CNN MobileNetV3-Large FPN (torchvision), batch 8, images about 480x640 (varying), fp32, SGD",
    detection("fasterrcnn_mobilenet_v3_large_fpn", 8))
add("retinanet_r50_b4", "detection", D, "RetinaNet ResNet-50 FPN, batch 4, images about 480x640 (varying), fp32, SGD",
    detection("retinanet_resnet50_fpn", 4))

add("opt_350m_generate_dynamic", "opt", D, "OPT-350m-style decoder greedy generation, bf16 weights, batch in {1,8,32}, prompt in {64,256}, new tokens in {32,128}",
    hf_generate(lambda: opt(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                            ffn_dim=4096, word_embed_proj_dim=512), (1, 8, 32), (64, 256), (32, 128)))
add("pythia_410m_generate_dynamic", "gptneox", D, "Pythia-410m-style (GPT-NeoX) greedy generation, bf16 weights, batch in {1,8,32}, prompt in {64,256}, new tokens in {32,128}",
    hf_generate(lambda: gptneox(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                intermediate_size=4096, vocab_size=50304), (1, 8, 32), (64, 256), (32, 128)))

RECIPES = R
