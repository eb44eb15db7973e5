"""Calibration: torch microbenchmarks (``harness``), the fitter (``fit``), public-table
fitting (``fit_public``) and validation (``validate``) of disaggsim's cost model.

Only :mod:`calibration.harness` imports torch, and only when a sweep runs.
"""
