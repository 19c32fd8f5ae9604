"""Our tuned lens against the tuned-lens package (Belrose et al.) on the same model and data.

A GPT-2-style circuitlab model (trained for a few hundred steps on the built-in stories, so that its
layers carry real structure) is exported to Hugging Face with circuitlab.pretrained.export_hf; the
package's TunedLens is trained on the HF model with the package's own recipe (SGD, Nesterov momentum
0.9, lr 1.0, linear decay, gradient clipping at 1, KL to the final distribution, translators added
residually and initialised at zero), ours on the circuitlab model (Adam, identity init). Same token
batches, same number of steps; both are scored on held-out batches by KL(final ‖ lens) per layer,
next to the logit lens.

    .venv/bin/python benchmarks/compare_tuned_lens.py [--steps 300 --train-steps 400]
"""
from __future__ import annotations

import argparse
import tempfile

import torch


def train_model(steps: int, seed: int = 0):
    from circuitlab import ModelConfig, Transformer
    from circuitlab.analysis.lens.tuned import story_batches
    from circuitlab.data import build_tokenizer, generate_stories

    torch.manual_seed(seed)
    tok = build_tokenizer("bpe", generate_stories(2000, seed=0), vocab_size=512)
    model = Transformer(ModelConfig.from_preset("gpt2-tiny", n_layers=4, d_model=64, n_heads=4, d_vocab=tok.vocab_size,
                                                n_ctx=64))
    model.unembed.bias.requires_grad_(False)  # stays 0: no HF architecture has an unembedding bias
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    data = story_batches(tok, 64, 16, 64, seed=0)
    for i in range(steps):
        loss = model.loss(data[i % len(data)])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"trained a 4-layer GPT-2-style model for {steps} steps: loss {float(loss.detach()):.3f}")
    return model.eval(), tok


def package_lens(hf, batches, steps: int):
    """The tuned-lens package's TunedLens trained with its own recipe (scripts/train_loop.py, ingredients.py)."""
    from tuned_lens.nn.lenses import TunedLens

    lens = TunedLens.from_model(hf).float()
    for p in hf.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD(lens.parameters(), lr=1.0, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / steps))
    for i in range(steps):
        with torch.no_grad():
            out = hf(batches[i % len(batches)], output_hidden_states=True)
        target = out.logits.float().log_softmax(-1)
        for j, h in enumerate(out.hidden_states[:-1]):
            loss = (target.exp() * (target - lens(h, idx=j).log_softmax(-1))).sum(-1).mean()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(lens.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
    return lens


@torch.no_grad()
def package_kl(hf, lens, batches) -> list[float]:
    total = None
    for tokens in batches:
        out = hf(tokens, output_hidden_states=True)
        final = out.logits.float().log_softmax(-1)
        kls = [(final.exp() * (final - lens(h, idx=j).log_softmax(-1))).sum(-1).mean()
               for j, h in enumerate(out.hidden_states[:-1])]
        kls = torch.stack(kls + [torch.tensor(0.0)])
        total = kls if total is None else total + kls
    return (total / len(batches)).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="lens training steps (both lenses)")
    parser.add_argument("--train-steps", type=int, default=400, help="model training steps")
    args = parser.parse_args()
    import transformers

    from circuitlab.analysis.lens.tuned import mean_kl_to_final, story_batches, train_tuned_lens
    from circuitlab.pretrained import export_hf

    model, tok = train_model(args.train_steps)
    train, held = story_batches(tok, 16, 16, 64, seed=1), story_batches(tok, 4, 16, 64, seed=2)
    with tempfile.TemporaryDirectory() as folder:
        export_hf(model, folder)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ours = train_tuned_lens(model, train, steps=args.steps)
    theirs = package_lens(hf, train, args.steps)
    rows = {"logit lens": mean_kl_to_final(model, held).tolist(),
            "tuned lens (circuitlab)": mean_kl_to_final(model, held, ours).tolist(),
            "tuned lens (package)": package_kl(hf, theirs, held)}
    labels = ["embed"] + [f"L{l}" for l in range(model.cfg.n_layers)]
    print(f"held-out KL(final ‖ lens), nats, per residual point ({args.steps} lens steps each)")
    print(f"{'':<26}" + "".join(f"{lab:>9}" for lab in labels))
    for name, values in rows.items():
        print(f"{name:<26}" + "".join(f"{v:>9.4f}" for v in values))


if __name__ == "__main__":
    main()
