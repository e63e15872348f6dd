"""Train a small VQ-VAE on real photographs with torchkm.nn.VectorQuantizer.

The images are the two photographs that ship inside scikit-learn (``load_sample_images``): the model
trains on random 32 x 32 crops of ``china.jpg`` and is shown on both whole images, so ``flower.jpg``
is never seen in training. The encoder maps each 4 x 4 pixel block to a 32-d vector, which the
quantizer replaces by one of 256 codes (a k-means codebook kept up to date by EMA, with dead-code
revival); the decoder draws the image back from the codes alone.

Writes ``out/vqvae_training.png`` (reconstruction loss, code perplexity and dead codes over the steps)
and ``out/vqvae_reconstructions.png`` (originals above their reconstructions), and prints a table.
``--compare`` trains the same model, from the same weights and the same batches, with
vector-quantize-pytorch's ``VectorQuantize`` at equal settings (``pip install vector-quantize-pytorch``).

    python examples/vqvae.py                  # CPU, about a minute on two cores
    python examples/vqvae.py --device cuda --steps 3000 --compare
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import torchkm


def load_photos() -> dict[str, torch.Tensor]:
    """scikit-learn's two bundled photographs as float (3, H, W) tensors in [0, 1], cropped to multiples of 4."""
    from sklearn.datasets import load_sample_images

    photos = {}
    for path, image in zip(load_sample_images().filenames, load_sample_images().images):
        h, w = (s - s % 4 for s in image.shape[:2])
        photos[Path(path).stem] = torch.from_numpy(np.array(image[:h, :w])).permute(2, 0, 1).float() / 255.0
    return photos


class Autoencoder(nn.Module):
    """Convolutional encoder/decoder, 4x down- and upsampling, with a quantizer in between."""

    def __init__(self, quantizer: nn.Module, dim: int = 32, width: int = 64) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, width, 4, 2, 1), nn.ReLU(),
            nn.Conv2d(width, width, 4, 2, 1), nn.ReLU(),
            nn.Conv2d(width, width, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(width, dim, 1),
        )
        self.decoder = nn.Sequential(
            nn.Conv2d(dim, width, 3, 1, 1), nn.ReLU(),
            nn.ConvTranspose2d(width, width, 4, 2, 1), nn.ReLU(),
            nn.ConvTranspose2d(width, 3, 4, 2, 1),
        )
        self.quantizer = quantizer

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = self.encoder(images - 0.5)
        b, dim, h, w = z.shape
        # (B, H/4 * W/4, dim), vectors last: the layout both libraries' quantizers take.
        quantized, indices, vq_loss = self.quantizer(z.flatten(2).transpose(1, 2))
        return self.decoder(quantized.transpose(1, 2).reshape(b, dim, h, w)) + 0.5, indices, vq_loss


def make_quantizer(library: str, args: argparse.Namespace) -> nn.Module:
    if library == "torchkm":
        return torchkm.nn.VectorQuantizer(
            args.codes, args.dim, decay=args.decay, commitment_weight=args.commitment,
            dead_code_threshold=args.dead_threshold, kmeans_iters=10, seed=args.seed,
        )
    from vector_quantize_pytorch import VectorQuantize

    # Equal settings: EMA codebook with the same decay, k-means init, commitment weight and
    # dead-code threshold, and plain straight-through gradients (its default is the rotation trick).
    return VectorQuantize(
        dim=args.dim, codebook_size=args.codes, decay=args.decay, commitment_weight=args.commitment,
        kmeans_init=True, kmeans_iters=10, threshold_ema_dead_code=args.dead_threshold, rotation_trick=False,
    )


def random_crops(image: torch.Tensor, count: int, size: int, generator: torch.Generator) -> torch.Tensor:
    _, h, w = image.shape
    top = torch.randint(0, h - size + 1, (count,), generator=generator)
    left = torch.randint(0, w - size + 1, (count,), generator=generator)
    crops = torch.stack([image[:, t : t + size, s : s + size] for t, s in zip(top.tolist(), left.tolist())])
    flip = torch.rand(count, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], crops.flip(-1), crops)


def train(library: str, args: argparse.Namespace, photos: dict[str, torch.Tensor]) -> dict:
    torch.manual_seed(args.seed)
    model = Autoencoder(nn.Identity(), dim=args.dim)  # the same encoder and decoder weights for every library
    model.quantizer = make_quantizer(library, args)
    model = model.to(args.device)
    torch.manual_seed(args.seed + 1)  # and the same random state from here on
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    batches = torch.Generator().manual_seed(args.seed)  # same crops for every library
    train_image = photos["china"]
    history: dict[str, list[float]] = {"step": [], "recon": [], "perplexity": [], "dead": []}
    used = torch.zeros(args.window, args.codes, dtype=torch.bool)
    t0 = t_warm = time.perf_counter()
    warmup = min(20, args.steps // 2)  # first steps: k-means initialisation, kernel compilation
    for step in range(1, args.steps + 1):
        if step == warmup + 1:
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t_warm = time.perf_counter()
        images = random_crops(train_image, args.batch, 32, batches).to(args.device)
        recon, indices, vq_loss = model(images)
        recon_loss = F.mse_loss(recon, images)
        optimizer.zero_grad(set_to_none=True)
        (recon_loss + vq_loss).backward()
        optimizer.step()
        used[step % args.window] = torch.zeros(args.codes, dtype=torch.bool).index_fill_(0, indices.flatten().cpu(), True)
        if step % args.log_every == 0 or step == args.steps:
            history["step"].append(step)
            history["recon"].append(recon_loss.item())
            history["perplexity"].append(torchkm.nn.perplexity(indices, args.codes).item())
            # Dead: not chosen by any vector of the last `window` batches.
            history["dead"].append(int(args.codes - used[: min(step, args.window)].any(0).sum()))
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    step_ms = (time.perf_counter() - t_warm) / max(1, args.steps - warmup) * 1e3
    model.eval()
    with torch.no_grad():
        recons = {name: model(img[None].to(args.device))[0][0].clamp(0, 1).cpu() for name, img in photos.items()}
        test_mse = {name: F.mse_loss(recons[name], img).item() for name, img in photos.items()}
        eval_codes = torch.cat([model(img[None].to(args.device))[1].flatten().cpu() for img in photos.values()])
    return {
        "library": library, "history": history, "seconds": seconds, "step_ms": step_ms, "recons": recons, "test_mse": test_mse,
        "codes_used_on_images": int(eval_codes.unique().numel()),
    }


def plot(results: list[dict], photos: dict[str, torch.Tensor], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for r in results:
        h = r["history"]
        axes[0].plot(h["step"], h["recon"], label=r["library"])
        axes[1].plot(h["step"], h["perplexity"], label=r["library"])
        axes[2].plot(h["step"], h["dead"], label=r["library"])
    axes[0].set(title="reconstruction MSE (training batch)", xlabel="step", yscale="log")
    axes[1].set(title="code perplexity (training batch)", xlabel="step")
    axes[2].set(title="dead codes (unused in the last batches)", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "vqvae_training.png", dpi=110)
    plt.close(fig)

    rows = 1 + len(results)
    fig, axes = plt.subplots(rows, len(photos), figsize=(5.2 * len(photos), 3.6 * rows), squeeze=False)
    for col, (name, img) in enumerate(photos.items()):
        seen = "training image" if name == "china" else "not seen in training"
        axes[0, col].imshow(img.permute(1, 2, 0).numpy())
        axes[0, col].set_title(f"{name}.jpg ({seen})")
        for row, r in enumerate(results, start=1):
            axes[row, col].imshow(r["recons"][name].permute(1, 2, 0).numpy())
            axes[row, col].set_title(f"{r['library']}: reconstruction, MSE {r['test_mse'][name]:.4f}")
    for ax in axes.flat:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out / "vqvae_reconstructions.png", dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32, help="32x32 crops per step (64 vectors each)")
    parser.add_argument("--codes", type=int, default=256)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--decay", type=float, default=0.95)
    parser.add_argument("--commitment", type=float, default=0.25)
    parser.add_argument("--dead-threshold", type=float, default=0.5, help="EMA vectors per step below which a code is revived")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--window", type=int, default=50, help="batches over which a code must be used to count as alive")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", action="store_true", help="also train with vector-quantize-pytorch")
    parser.add_argument("--out", type=Path, default=Path("out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    photos = load_photos()
    libraries = ["torchkm"] + (["vector-quantize-pytorch"] if args.compare else [])
    results = [train(lib, args, photos) for lib in libraries]

    print(f"{args.steps} steps of {args.batch} crops, {args.codes} codes of dim {args.dim}, device {args.device}")
    print(f"{'library':<24}{'seconds':>9}{'ms/step':>9}{'final recon':>13}{'perplexity':>12}{'dead codes':>12}"
          f"{'china MSE':>11}{'flower MSE':>12}{'codes used':>12}")
    for r in results:
        h = r["history"]
        print(f"{r['library']:<24}{r['seconds']:>9.1f}{r['step_ms']:>9.1f}{np.mean(h['recon'][-5:]):>13.5f}{np.mean(h['perplexity'][-5:]):>12.1f}"
              f"{h['dead'][-1]:>12d}{r['test_mse']['china']:>11.5f}{r['test_mse']['flower']:>12.5f}{r['codes_used_on_images']:>12d}")
    plot(results, photos, args.out)
    summary = [{k: v for k, v in r.items() if k != "recons"} | {"args": {k: str(v) for k, v in vars(args).items()}} for r in results]
    (args.out / "vqvae.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out / 'vqvae_training.png'}, {args.out / 'vqvae_reconstructions.png'} and {args.out / 'vqvae.json'}")


if __name__ == "__main__":
    main()
