"""Hydra entry points: train, sample, evaluate, reproduce. Thin: no maths here."""
