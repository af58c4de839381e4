"""The capacity planner's engine half: a step-time model fitted to measured steps
(``stepmodel``), a calibration run on the real engine (``calibrate``), and a seeded
discrete-event simulation of the fair queue's lanes and the continuous-batching scheduler
(``simulate``) with the searches a plan needs (``search``), and the measure of how long a full
worker's freed slot stays empty, from requests' timelines (``refill``). Plain Python and
PyTorch, no Django: the command and the ops page live in routing."""

from workers.engine.planner.search import (
    Plan,
    Targets,
    capacity_search,
    plan_make,
    workers_needed,
)
from workers.engine.planner.simulate import (
    Mix,
    Prediction,
    RequestClass,
    ServerShape,
    simulate,
)
from workers.engine.planner.stepmodel import StepSample, StepTimeModel, step_model_fit

__all__ = [
    "Mix",
    "Plan",
    "Prediction",
    "RequestClass",
    "ServerShape",
    "StepSample",
    "StepTimeModel",
    "Targets",
    "capacity_search",
    "plan_make",
    "simulate",
    "step_model_fit",
    "workers_needed",
]
