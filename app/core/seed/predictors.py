"""Load predictors: forecast the next interval's request count, mean ISL and mean OSL.

Follows Dynamo's planner (`core/load/predictors.py`, reference notes §2) with the libraries it
uses: `constant` (last value), `arima` (pmdarima `auto_arima`, then incremental
`model.update`), `kalman` (filterpy local linear trend) and `prophet` (a new `Prophet()` fitted
on a rolling window for every forecast).

Common behaviour of every predictor (`SeriesPredictor`):

- Leading idle intervals (0 before the first non-zero value) are skipped; zeros after traffic
  was seen are kept. `reset_idle_skip()` re-arms the skip, e.g. after a warm start, so the idle
  minutes after a deployment starts do not drag a warmed forecast to zero.
- Non-finite values (NaN, ±inf) and negative values never reach a model: they are ignored and
  counted (`ignored_non_finite`, `ignored_negative`). Dynamo feeds NaN as 0; here a missing
  reading is unknown, never zero traffic.
- Forecasts are finite and ≥ 0: negative forecasts are clamped to 0; a non-finite forecast
  raises `ValueError` (the model is reset so the next forecast starts again).
- Before a model has enough points it predicts the last value, and says so in the note of
  `predict()`. `predict_next()` is `predict().value`. A model error propagates: the caller
  (`TrafficPredictor`) falls back to the last value and records why.

`TrafficPredictor` runs one predictor per series (num_req, isl, osl) and turns their answers,
fallbacks included, into a `TrafficForecast` with notes.

Libraries are imported when a predictor that needs them is built: importing pmdarima takes
seconds, and a deployment with `constant` never needs it.
"""

from __future__ import annotations

import inspect
import logging
import math
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from app.core.types import TrafficForecast, TrafficObservation

# Prophet's rows are dated from here, one `step_s` apart (only their spacing matters).
PROPHET_START = datetime(2024, 1, 1)


class Predictor(Protocol):
    """One series' forecaster: feed one value per interval, ask for the next one."""

    name: str

    def observe(self, value: float) -> None: ...

    def predict_next(self) -> float: ...  # may raise


@dataclass(frozen=True)
class Prediction:
    """A forecast and, when it is not the model's own answer, why (e.g. too few points)."""

    value: float
    note: str | None = None


def _clamp(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} produced a non-finite forecast ({value})")
    return max(0.0, value)


def _to_model(value: float, log1p: bool) -> float:
    return math.log1p(value) if log1p else value


def _from_model(value: float, log1p: bool) -> float:
    if log1p:
        # expm1 overflows past ~709; that is "non-finite", caught by _clamp.
        return math.expm1(value) if value < 709.0 else math.inf
    return value


class SeriesPredictor:
    """The behaviour shared by every predictor: idle skip, input filtering, last-value fallback.

    Subclasses implement `_accept(value)` (a value that passed the filters) and `_forecast()`
    (called only once `history_len >= min_points`)."""

    name = "base"

    def __init__(self, min_points: int = 1) -> None:
        self.min_points = min_points
        self.history_len = 0  # accepted values
        self.last_value: float | None = None
        self.ignored_non_finite = 0
        self.ignored_negative = 0
        self.skipped_idle = 0
        self._seen_nonzero = False

    def reset_idle_skip(self) -> None:
        """Skip zeros again until the next non-zero value (call after a warm start)."""
        self._seen_nonzero = False

    def observe(self, value: float) -> None:
        self.offer(value)

    def offer(self, value: float) -> bool:
        """`observe`, telling whether the value reached the model (False: skipped or ignored)."""
        value = float(value)
        if not math.isfinite(value):
            self.ignored_non_finite += 1
            return False
        if value < 0:
            self.ignored_negative += 1
            return False
        if value == 0 and not self._seen_nonzero:
            self.skipped_idle += 1
            return False
        if value != 0:
            self._seen_nonzero = True
        self.history_len += 1
        self.last_value = value
        self._accept(value)
        return True

    def predict(self) -> Prediction:
        if self.last_value is None:
            return Prediction(0.0, f"{self.name}: no history yet, predicting 0")
        if self.history_len < self.min_points:
            return Prediction(
                self.last_value,
                f"{self.name}: {self.history_len} of {self.min_points} points, "
                f"using last value {self.last_value}",
            )
        return Prediction(_clamp(self._forecast(), self.name))

    def predict_next(self) -> float:
        return self.predict().value

    def _accept(self, value: float) -> None:
        pass

    def _forecast(self) -> float:
        raise NotImplementedError


class ConstantPredictor(SeriesPredictor):
    """The next interval looks like the last one."""

    name = "constant"

    def __init__(self) -> None:
        super().__init__(min_points=1)

    def _forecast(self) -> float:
        assert self.last_value is not None
        return self.last_value


class ArimaPredictor(SeriesPredictor):
    """pmdarima `auto_arima`, fitted once on the whole history, then `model.update(new points)`.

    Like Dynamo: below `min_points` the last value; an all-identical history predicts that value
    (ARIMA predicts 0 there); in raw mode, if the selected order collapses to `(0, d, 0)`, refit on
    `log1p` values and keep log1p from then on. After a model error the next forecast refits
    from the whole history (Dynamo drops the points it failed to add instead)."""

    name = "arima"

    def __init__(self, log1p: bool = False, min_points: int = 5) -> None:
        super().__init__(min_points=min_points)
        import pmdarima  # noqa: F401  (fail at construction, not at the first forecast)

        self.requested_log1p = log1p
        self.log1p = log1p  # the mode in use; may switch to True after the first fit
        self.model: Any = None
        self._raw: list[float] = []
        self._pending: list[float] = []  # raw points the fitted model has not seen yet
        self._distinct: set[float] = set()

    @property
    def order(self) -> tuple[int, int, int] | None:
        return None if self.model is None else tuple(self.model.order)

    def _accept(self, value: float) -> None:
        self._raw.append(value)
        self._pending.append(value)
        if len(self._distinct) < 2:
            self._distinct.add(value)

    def _fit(self, log1p: bool) -> Any:
        import pmdarima

        values = [_to_model(v, log1p) for v in self._raw]
        return pmdarima.auto_arima(values, suppress_warnings=True, error_action="ignore")

    def _forecast(self) -> float:
        if len(self._distinct) == 1:
            return self._raw[0]
        try:
            if self.model is None:
                model = self._fit(self.requested_log1p)
                log1p = self.requested_log1p
                p, _, q = model.order
                if p == 0 and q == 0 and not log1p:
                    try:
                        model, log1p = self._fit(True), True
                    except Exception:  # keep the raw model, as Dynamo does
                        pass
                self.model, self.log1p = model, log1p
            elif self._pending:
                self.model.update([_to_model(v, self.log1p) for v in self._pending])
            self._pending = []
            forecast = float(self.model.predict(n_periods=1)[0])
        except Exception:
            self.model, self.log1p, self._pending = None, self.requested_log1p, []
            raise
        return _from_model(forecast, self.log1p)


class KalmanPredictor(SeriesPredictor):
    """filterpy `KalmanFilter` with a local linear trend: state `[level, trend]`.

    `F = [[1, 1], [0, 1]]`, `H = [[1, 0]]`, `P = 1000·I`, `R = max(1e-9, r)`,
    `Q = diag(max(1e-12, q_level), max(1e-12, q_trend))`. The first point sets `x = [z, 0]`;
    every later point is a predict step (unless this interval's forecast already made it) and an
    update. The forecast is the predicted level, cached: asking twice in one interval does not
    advance the filter. Below `min_points` accepted points the last value (E4 behaviour)."""

    name = "kalman"

    def __init__(
        self,
        q_level: float = 1.0,
        q_trend: float = 0.1,
        r: float = 10.0,
        min_points: int = 5,
        log1p: bool = False,
    ) -> None:
        super().__init__(min_points=min_points)
        self.q_level, self.q_trend, self.r, self.log1p = q_level, q_trend, r, log1p
        self.kf = self._make_filter()
        self._initialised = False
        self._cached: float | None = None  # predicted level (model space) for the coming interval

    def _make_filter(self) -> Any:
        import numpy as np
        from filterpy.kalman import KalmanFilter

        kf = KalmanFilter(dim_x=2, dim_z=1)
        kf.x = np.zeros((2, 1))
        kf.F = np.array([[1.0, 1.0], [0.0, 1.0]])
        kf.H = np.array([[1.0, 0.0]])
        kf.P *= 1000.0
        kf.R = np.array([[max(1e-9, float(self.r))]])
        kf.Q = np.diag([max(1e-12, float(self.q_level)), max(1e-12, float(self.q_trend))])
        return kf

    def _accept(self, value: float) -> None:
        import numpy as np

        z = _to_model(value, self.log1p)
        cached, self._cached = self._cached, None
        if self._initialised:
            try:
                if cached is None:
                    self.kf.predict()
                self.kf.update(np.array([[z]]))
                return
            except Exception:  # a broken state: start again from this point
                self.kf = self._make_filter()
        self.kf.x = np.array([[z], [0.0]])
        self._initialised = True

    def _forecast(self) -> float:
        if self._cached is None:
            try:
                self.kf.predict()
                level = float(self.kf.x[0, 0])
                if not math.isfinite(level):
                    raise ValueError(f"kalman state became non-finite ({level})")
            except Exception:
                # Start again from the next observation rather than keep a broken state.
                self.kf, self._initialised = self._make_filter(), False
                raise
            self._cached = level
        return _from_model(self._cached, self.log1p)


class ProphetPredictor(SeriesPredictor):
    """Meta's Prophet, default settings, refitted on the last `window` points at every forecast.

    Rows are `{ds: PROPHET_START + k·step_s, y}`, k counting accepted points only; the forecast
    is for the step after the last row. `step_s` should be the throughput interval: with the
    default window of 50 and intervals of minutes the window spans hours, below Prophet's
    two-day threshold for daily seasonality, so the spacing changes nothing but the dates.
    `uncertainty_samples=0`: only `yhat` is used, and the intervals cost time (yhat is the same)."""

    name = "prophet"

    def __init__(
        self, window: int = 50, step_s: float = 180.0, log1p: bool = False, min_points: int = 5
    ) -> None:
        super().__init__(min_points=min_points)
        _quiet_prophet_logging()
        import prophet  # noqa: F401

        self.window, self.step_s, self.log1p = window, step_s, log1p
        self.rows: deque[tuple[datetime, float]] = deque(maxlen=window)
        self.step = 0  # index of the next accepted point

    def _date(self, step: int) -> datetime:
        return PROPHET_START + timedelta(seconds=step * self.step_s)

    def _accept(self, value: float) -> None:
        self.rows.append((self._date(self.step), _to_model(value, self.log1p)))
        self.step += 1

    def _forecast(self) -> float:
        import pandas as pd
        from prophet import Prophet

        frame = pd.DataFrame({"ds": [d for d, _ in self.rows], "y": [y for _, y in self.rows]})
        future = pd.DataFrame({"ds": [self._date(self.step)]})
        with warnings.catch_warnings():
            # prophet 1.1 uses DataFrame.drop(inplace=True), deprecated by pandas 3.1: not ours to fix.
            warnings.filterwarnings("ignore", message=".*inplace keyword.*", category=DeprecationWarning)
            model = Prophet(uncertainty_samples=0)
            model.fit(frame)
            yhat = float(model.predict(future)["yhat"].iloc[0])
        return _from_model(yhat, self.log1p)


_QUIETED = False


def _quiet_prophet_logging() -> None:
    """Prophet logs every fit through cmdstanpy at INFO, and an ERROR about plotly at import."""
    global _QUIETED
    if _QUIETED:
        return
    # With a handler present cmdstanpy does not install its own INFO StreamHandler.
    logging.getLogger("cmdstanpy").addHandler(logging.NullHandler())
    logging.getLogger("cmdstanpy").setLevel(logging.WARNING)
    logging.getLogger("prophet").setLevel(logging.WARNING)
    logging.getLogger("prophet.plot").setLevel(logging.CRITICAL)
    _QUIETED = True


PREDICTORS: dict[str, type[SeriesPredictor]] = {
    "constant": ConstantPredictor,
    "arima": ArimaPredictor,
    "kalman": KalmanPredictor,
    "prophet": ProphetPredictor,
}

# Parameter checks: (type description, predicate)
_CHECKS: dict[type, tuple[str, Callable[[object], bool]]] = {
    bool: ("a boolean", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: (
        "a number",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
    ),
}
_MINIMUMS: dict[str, float] = {
    "min_points": 1,
    "window": 2,
    "q_level": 0.0,
    "q_trend": 0.0,
    "r": 0.0,
}


def make_predictor(kind: str, params: Mapping[str, object]) -> Predictor:
    """Build a predictor from its configuration name and parameters, checking both."""
    return _build(kind, params)


def _build(kind: str, params: Mapping[str, object]) -> SeriesPredictor:
    cls = PREDICTORS.get(kind)
    if cls is None:
        raise ValueError(f"unknown predictor {kind!r}; known: {', '.join(sorted(PREDICTORS))}")
    signature = inspect.signature(cls.__init__)
    accepted = {
        name: p
        for name, p in signature.parameters.items()
        if name != "self" and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    }
    kwargs: dict[str, Any] = {}
    for name, value in params.items():
        if name not in accepted:
            known = ", ".join(sorted(accepted)) or "none"
            raise ValueError(f"unknown parameter {name!r} for predictor {kind!r}; accepted: {known}")
        expected = type(accepted[name].default)
        what, ok = _CHECKS[expected]
        if not ok(value):
            raise ValueError(f"predictor {kind!r}: parameter {name!r} must be {what}, got {value!r}")
        minimum = _MINIMUMS.get(name)
        if minimum is not None and value < minimum:  # type: ignore[operator]
            raise ValueError(f"predictor {kind!r}: parameter {name!r} must be >= {minimum}, got {value!r}")
        if name == "step_s" and value <= 0:  # type: ignore[operator]
            raise ValueError(f"predictor {kind!r}: parameter 'step_s' must be > 0, got {value!r}")
        kwargs[name] = float(value) if expected is float else value  # type: ignore[arg-type]
    if kind == "prophet":
        min_points, window = kwargs.get("min_points", 5), kwargs.get("window", 50)
        if min_points < 2:
            raise ValueError(
                "predictor 'prophet': parameter 'min_points' must be >= 2 (Prophet needs 2 rows)"
            )
        if window < min_points:
            raise ValueError(
                f"predictor 'prophet': parameter 'window' ({window}) must be >= min_points ({min_points})"
            )
    return cls(**kwargs)


SERIES = ("num_req", "isl", "osl")


class TrafficPredictor:
    """Three predictors of one kind, for the request count, the mean ISL and the mean OSL.

    An observation's fields that are None or NaN are skipped for their series only. When
    `num_req` is 0 the interval's ISL/OSL say nothing about request sizes and are skipped too
    (Dynamo E4 feeds the last ISL/OSL again instead; here idle intervals are simply absent from
    the ISL/OSL histories)."""

    def __init__(self, kind: str, params: Mapping[str, object]) -> None:
        self.kind = kind
        self.predictors: dict[str, SeriesPredictor] = {s: _build(kind, params) for s in SERIES}

    @property
    def history_len(self) -> int:
        """Accepted request-count intervals (the series the replica formulas scale with)."""
        return self.predictors["num_req"].history_len

    @property
    def history_lens(self) -> dict[str, int]:
        return {s: p.history_len for s, p in self.predictors.items()}

    @property
    def ignored_non_finite(self) -> dict[str, int]:
        return {s: p.ignored_non_finite for s, p in self.predictors.items()}

    def observe(self, obs: TrafficObservation) -> None:
        self._offer(obs)

    def _offer(self, obs: TrafficObservation) -> bool:
        used = False
        if obs.num_req is not None:
            used = self.predictors["num_req"].offer(obs.num_req)
        if obs.num_req == 0:
            return used
        for series, value in (("isl", obs.isl), ("osl", obs.osl)):
            if value is not None:
                used = self.predictors[series].offer(value) or used
        return used

    def warm(self, observations: Iterable[TrafficObservation]) -> int:
        """Feed history (e.g. a bucketed trace); returns how many observations reached a model.

        Re-arms the idle skip afterwards, so zeros right after start-up are not taken as traffic
        falling to nothing."""
        used = sum(1 for obs in observations if self._offer(obs))
        for predictor in self.predictors.values():
            predictor.reset_idle_skip()
        return used

    def forecast(self) -> TrafficForecast | None:
        """The next interval's load; None until each series has at least one accepted value."""
        if any(p.last_value is None for p in self.predictors.values()):
            return None
        values: dict[str, float] = {}
        notes: list[str] = []
        for series, predictor in self.predictors.items():
            last = predictor.last_value
            assert last is not None
            try:
                prediction = predictor.predict()
            except Exception as exc:  # any model failure: fall back, say why
                prediction = Prediction(
                    last,
                    f"{predictor.name} predict failed ({type(exc).__name__}: {exc}): using last value {last}",
                )
            values[series] = prediction.value
            if prediction.note:
                notes.append(f"{series}: {prediction.note}")
        return TrafficForecast(
            num_req=values["num_req"], isl=values["isl"], osl=values["osl"], notes=tuple(notes)
        )
