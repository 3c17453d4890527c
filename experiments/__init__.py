"""Hydra entry points: train, sample, evaluate, distill, reproduce, train_classifier,
reconstruct. Thin: no maths here."""
