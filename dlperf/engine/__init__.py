"""Turns a model + hardware + plan into a Prediction (time and memory breakdowns, throughput, MFU)."""

from __future__ import annotations

from typing import Any


def predict(model: Any, hardware: Any, plan: Any) -> Any:
    """`dlperf.engine.predict(model, hardware, plan)`; see dlperf.engine.step.predict."""
    from dlperf.engine.step import predict as _predict

    return _predict(model, hardware, plan)
