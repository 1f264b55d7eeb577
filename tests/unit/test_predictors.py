"""Load predictors (constant, arima, kalman, prophet) and the three-series TrafficPredictor.

Known answers: a constant series predicts itself; a straight line is extrapolated by Kalman and
Prophet; ARIMA's answers are compared with pmdarima called directly on the same (cleaned)
values; exact clamping and fallback behaviour use stub models. The reference scenarios of §10.2 D
(reference notes, "Predictors") are marked `ref_D`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pmdarima
import pytest
from filterpy.kalman import KalmanFilter
from prophet import Prophet

from app.core.seed.predictors import (
    PREDICTORS,
    ArimaPredictor,
    ConstantPredictor,
    KalmanPredictor,
    Prediction,
    Predictor,
    ProphetPredictor,
    SeriesPredictor,
    TrafficPredictor,
    make_predictor,
)
from app.core.types import TrafficForecast, TrafficObservation

NAN, INF = math.nan, math.inf
MIN_POINTS = {"constant": 1, "arima": 5, "kalman": 5, "prophet": 5}


def feed(kind: str, values: Sequence[float], **params: Any) -> SeriesPredictor:
    predictor = make_predictor(kind, params)
    assert isinstance(predictor, SeriesPredictor)
    for v in values:
        predictor.observe(v)
    return predictor


def ar1_series(n: int = 60) -> list[float]:
    rng = np.random.default_rng(7)
    y = [50.0]
    for _ in range(n - 1):
        y.append(50 + 0.8 * (y[-1] - 50) + float(rng.normal(0, 3)))
    return y


def test_protocol_is_satisfied() -> None:
    predictor: Predictor = ConstantPredictor()
    assert predictor.name == "constant"
    assert set(PREDICTORS) == {"constant", "arima", "kalman", "prophet"}


# --- behaviour shared by every predictor ----------------------------------------------------------


@dataclass(frozen=True)
class InputCase:
    name: str
    why: str
    values: list[float]
    history_len: int
    last_value: float | None
    skipped_idle: int = 0
    ignored_non_finite: int = 0
    ignored_negative: int = 0


INPUT_CASES = [
    InputCase("empty", "nothing observed", [], 0, None),
    InputCase("ref_D_leading_zeros_not_stored", "idle before traffic is skipped", [0, 0, 5], 1, 5.0, 2),
    InputCase("ref_D_zero_after_traffic_kept", "traffic falling to zero is real", [5, 0], 2, 0.0),
    InputCase(
        "non_finite_ignored_and_counted",
        "NaN/±inf never reach a model (Dynamo feeds them as 0; unknown is not zero here)",
        [5, NAN, INF, -INF],
        1,
        5.0,
        ignored_non_finite=3,
    ),
    InputCase("nan_before_traffic", "NaN does not end the idle skip", [NAN, 0, 3], 1, 3.0, 1, 1),
    InputCase(
        "negative_ignored", "a negative count is a broken reading", [5, -1], 1, 5.0, ignored_negative=1
    ),
]


@pytest.mark.parametrize("kind", sorted(PREDICTORS))
@pytest.mark.parametrize("case", INPUT_CASES, ids=lambda c: c.name)
def test_input_filtering(case: InputCase, kind: str) -> None:
    p = feed(kind, case.values)
    got = (p.history_len, p.last_value, p.skipped_idle, p.ignored_non_finite, p.ignored_negative)
    want = (
        case.history_len,
        case.last_value,
        case.skipped_idle,
        case.ignored_non_finite,
        case.ignored_negative,
    )
    assert got == want, case.why
    # Below each model's minimum it answers the last value (0 when empty), and says so.
    if case.last_value is None:
        assert p.predict() == Prediction(0.0, f"{kind}: no history yet, predicting 0"), case.why
    elif case.history_len < MIN_POINTS[kind]:
        expected_note = (
            f"{kind}: {case.history_len} of {MIN_POINTS[kind]} points, using last value {case.last_value}"
        )
        assert p.predict() == Prediction(case.last_value, expected_note), case.why
    else:
        assert p.predict() == Prediction(case.last_value), case.why


@pytest.mark.parametrize("kind", sorted(PREDICTORS))
def test_reset_idle_skip_rearms(kind: str) -> None:
    p = feed(kind, [4, 0])  # zero after traffic: kept
    p.reset_idle_skip()
    p.observe(0)  # zero after a reset (e.g. after warm start): skipped again
    assert (p.history_len, p.skipped_idle, p.last_value) == (2, 1, 0.0)
    p.observe(6)
    p.observe(0)  # traffic seen again: zeros count
    assert (p.history_len, p.last_value) == (4, 0.0)


# --- known answers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeriesCase:
    name: str
    why: str
    kind: str
    values: list[float]
    expected: float
    abs_tol: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)


CONSTANT_SERIES = [7.0] * 10
LINE_10_TO_500 = [10.0 * (i + 1) for i in range(50)]

SERIES_CASES = [
    SeriesCase("ref_D_constant_last_value", "last value", "constant", [10, 20, 30], 30.0),
    SeriesCase("constant_series_constant", "flat in, flat out", "constant", CONSTANT_SERIES, 7.0),
    SeriesCase(
        "arima_constant_series",
        "an all-identical history predicts its value (ARIMA alone would predict 0)",
        "arima",
        CONSTANT_SERIES,
        7.0,
    ),
    SeriesCase(
        "kalman_constant_series",
        "x starts at [7, 0] and every residual is 0: the state never moves",
        "kalman",
        CONSTANT_SERIES,
        7.0,
    ),
    SeriesCase("prophet_constant_series", "a flat trend", "prophet", CONSTANT_SERIES, 7.0, 1e-9),
    SeriesCase(
        "kalman_extrapolates_trend",
        "local linear trend: after 50 points of +10 the forecast is the next point on the line",
        "kalman",
        LINE_10_TO_500,
        510.0,
        1e-5,
    ),
    SeriesCase(
        "kalman_trend_log1p",
        "in log1p mode the filter follows log1p(y); a constant series still maps back exactly",
        "kalman",
        CONSTANT_SERIES,
        7.0,
        1e-12,
        {"log1p": True},
    ),
    SeriesCase(
        "prophet_extrapolates_trend",
        "Prophet's piecewise-linear trend continues a straight line one step",
        "prophet",
        [float(i) for i in range(1, 21)],
        21.0,
        1e-6,
    ),
    SeriesCase(
        "ref_D_kalman_declining_clamped",
        "the unclamped forecast is about -23.8: clamped to 0",
        "kalman",
        [100, 50, 10, 1, 0.5],
        0.0,
    ),
    SeriesCase(
        "ref_D_kalman_declining_clamped_log1p",
        "expm1 of a negative level is negative: clamped to 0 in log1p mode too",
        "kalman",
        [100, 50, 10, 1, 0.5],
        0.0,
        0.0,
        {"log1p": True},
    ),
    SeriesCase(
        "ref_D_prophet_negative_yhat_clamped",
        "a falling line's next point is below zero: clamped",
        "prophet",
        [100, 75, 50, 25, 5],
        0.0,
    ),
    SeriesCase(
        "ref_D_prophet_below_min_points",
        "fewer than 5 points: last value",
        "prophet",
        [3, 4, 5, 6],
        6.0,
    ),
    SeriesCase("arima_below_min_points", "fewer than 5 points: last value", "arima", [3, 4], 4.0),
]


@pytest.mark.parametrize("case", SERIES_CASES, ids=lambda c: c.name)
def test_known_answers(case: SeriesCase) -> None:
    value = feed(case.kind, case.values, **case.params).predict_next()
    if case.abs_tol:
        assert value == pytest.approx(case.expected, abs=case.abs_tol), case.why
    else:
        assert value == case.expected, case.why


# --- ARIMA against pmdarima itself ------------------------------------------------------------------


def auto_arima(values: Sequence[float]) -> Any:
    return pmdarima.auto_arima(list(values), suppress_warnings=True, error_action="ignore")


def test_arima_matches_pmdarima_on_cleaned_series() -> None:
    y = ar1_series()
    reference = auto_arima(y)
    assert reference.order[0] + reference.order[2] > 0  # no log1p switch for this series
    # Leading idle zeros and a NaN in the middle never reach the model.
    p = feed("arima", [0.0, 0.0, *y[:30], NAN, *y[30:]])
    assert isinstance(p, ArimaPredictor)
    assert p.predict_next() == float(reference.predict(n_periods=1)[0])
    assert (p.order, p.log1p) == (tuple(reference.order), False)


def test_arima_updates_incrementally(monkeypatch: pytest.MonkeyPatch) -> None:
    # After the first fit, new points go to model.update, never to a second auto_arima.
    y = ar1_series()
    fits: list[int] = []
    updates: list[list[float]] = []
    real_auto_arima = pmdarima.auto_arima

    def counting_auto_arima(values: list[float], **kwargs: Any) -> Any:
        fits.append(len(values))
        model = real_auto_arima(values, **kwargs)
        real_update = model.update
        model.update = lambda new, **kw: (updates.append(list(new)), real_update(new, **kw))[1]
        return model

    monkeypatch.setattr(pmdarima, "auto_arima", counting_auto_arima)
    p = feed("arima", y[:50])
    p.predict_next()
    p.observe(y[50])
    p.observe(y[51])
    value = p.predict_next()
    assert (fits, updates) == ([50], [[y[50], y[51]]])

    reference = real_auto_arima(y[:50], suppress_warnings=True, error_action="ignore")
    reference.update(y[50:52])
    assert value == float(reference.predict(n_periods=1)[0])


def test_arima_collapsed_order_switches_to_log1p() -> None:
    # A straight line selects (0, 1, 0) with drift in raw space; like Dynamo, refit on log1p(y).
    y = [float(i) for i in range(1, 31)]
    assert auto_arima(y).order == (0, 1, 0)
    p = feed("arima", y)
    assert isinstance(p, ArimaPredictor)
    value = p.predict_next()
    log_model = auto_arima([math.log1p(v) for v in y])
    assert (p.log1p, p.order) == (True, tuple(log_model.order))
    assert value == math.expm1(float(log_model.predict(n_periods=1)[0]))


class StubModel:
    """Stands in for a fitted pmdarima model: a fixed order and forecast, records updates."""

    def __init__(self, order: tuple[int, int, int], forecast: float) -> None:
        self.order = order
        self.forecast = forecast
        self.updates: list[list[float]] = []

    def update(self, values: list[float]) -> None:
        self.updates.append(list(values))

    def predict(self, n_periods: int) -> list[float]:
        return [self.forecast]


@dataclass(frozen=True)
class StubCase:
    name: str
    why: str
    log1p: bool
    forecast: float
    expected: float | str  # value, or the ValueError message


STUB_CASES = [
    StubCase("raw_value", "raw mode returns the model's forecast", False, 12.5, 12.5),
    StubCase("raw_negative_clamped", "a negative forecast is clamped to 0", False, -5.0, 0.0),
    StubCase("log1p_back_transformed", "log1p mode returns expm1(forecast)", True, math.log1p(99.0), 99.0),
    StubCase("log1p_negative_clamped", "expm1 of a negative forecast is negative: 0", True, -0.5, 0.0),
    StubCase(
        "nan_forecast_raises",
        "a non-finite forecast is an error for the caller, never a value",
        False,
        NAN,
        "arima produced a non-finite forecast (nan)",
    ),
    StubCase(
        "log1p_overflow_raises",
        "expm1 of a huge log value is not a forecast",
        True,
        1000.0,
        "arima produced a non-finite forecast (inf)",
    ),
]


@pytest.mark.parametrize("case", STUB_CASES, ids=lambda c: c.name)
def test_arima_output_with_stub_model(case: StubCase, monkeypatch: pytest.MonkeyPatch) -> None:
    model = StubModel((1, 0, 0), case.forecast)
    monkeypatch.setattr(pmdarima, "auto_arima", lambda values, **kw: model)
    p = feed("arima", [1, 2, 3, 4, 5], log1p=case.log1p)
    if isinstance(case.expected, str):
        with pytest.raises(ValueError) as info:
            p.predict_next()
        assert str(info.value) == case.expected, case.why
    else:
        assert p.predict_next() == pytest.approx(case.expected, rel=1e-12), case.why


def test_arima_update_gets_model_space_values(monkeypatch: pytest.MonkeyPatch) -> None:
    model = StubModel((1, 0, 0), 1.0)
    monkeypatch.setattr(pmdarima, "auto_arima", lambda values, **kw: model)
    p = feed("arima", [1, 2, 3, 4, 5], log1p=True)
    p.predict_next()
    p.observe(9)
    p.observe(NAN)
    p.predict_next()
    p.predict_next()  # nothing new: no empty update
    assert model.updates == [[math.log1p(9)]]


class FailingUpdateModel(StubModel):
    def update(self, values: list[float]) -> None:
        raise ValueError("update diverged")


def test_arima_refits_whole_history_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    # Dynamo drops the points a failed update could not add; here the next forecast refits on all.
    fits: list[list[float]] = []
    models = [FailingUpdateModel((1, 0, 0), 5.0), StubModel((1, 0, 0), 6.0)]

    def fake_auto_arima(values: list[float], **kwargs: Any) -> StubModel:
        fits.append(list(values))
        return models[len(fits) - 1]

    monkeypatch.setattr(pmdarima, "auto_arima", fake_auto_arima)
    p = feed("arima", [1, 2, 3, 4, 5])
    assert p.predict_next() == 5.0
    p.observe(7)
    with pytest.raises(ValueError, match="update diverged"):
        p.predict_next()
    p.observe(8)
    assert p.predict_next() == 6.0
    assert fits == [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 7, 8]]


# --- Kalman specifics -------------------------------------------------------------------------------


def test_ref_D_kalman_min_points_then_forecast() -> None:
    p = KalmanPredictor(min_points=3)
    assert p.predict_next() == 0.0
    p.observe(10)
    assert p.predict_next() == 10.0
    p.observe(20)
    assert p.predict_next() == 20.0
    p.observe(30)
    forecast = p.predict_next()
    assert forecast not in (0.0, 30.0)
    assert forecast == pytest.approx(40.0, abs=1.0)  # a rising trend is extrapolated


def test_ref_D_kalman_cached_forecast_does_not_advance() -> None:
    # Asking for forecasts, once or twice, leaves the filter where observing alone would: the
    # predict step made for a forecast is the one the next observation needs.
    never, once, twice = KalmanPredictor(), KalmanPredictor(), KalmanPredictor()
    for p in (never, once, twice):
        for v in LINE_10_TO_500[:10]:
            p.observe(v)
    first = once.predict_next()
    assert twice.predict_next() == twice.predict_next() == first
    for p in (never, once, twice):
        p.observe(115)
    assert np.array_equal(once.kf.x, never.kf.x) and np.array_equal(twice.kf.x, never.kf.x)
    assert once.predict_next() == twice.predict_next() == never.predict_next()


def test_kalman_parameters_reach_the_filter() -> None:
    p = feed("kalman", [], q_level=2.0, q_trend=0.5, r=0.0)
    assert isinstance(p, KalmanPredictor)
    assert np.array_equal(p.kf.Q, np.diag([2.0, 0.5]))
    assert np.array_equal(p.kf.R, np.array([[1e-9]]))  # floored like Dynamo's
    assert np.array_equal(p.kf.P, np.eye(2) * 1000.0)


# --- Prophet specifics ------------------------------------------------------------------------------


def test_ref_D_prophet_window_caps_rows() -> None:
    p = feed("prophet", [1, 2, 3, 4, 5, 6, 7, 8], window=5, step_s=60.0)
    assert isinstance(p, ProphetPredictor)
    start = datetime(2024, 1, 1)
    assert list(p.rows) == [(start + timedelta(seconds=60 * k), float(k + 1)) for k in range(3, 8)]


def test_ref_D_prophet_step_counts_accepted_points_only() -> None:
    p = feed("prophet", [0, 0, 5, NAN, 6], step_s=60.0)
    assert isinstance(p, ProphetPredictor)
    assert p.step == 2
    assert [d for d, _ in p.rows] == [datetime(2024, 1, 1), datetime(2024, 1, 1, 0, 1)]


@pytest.mark.parametrize("step_s", [30.0, 60.0, 120.0, 180.0, 300.0])
def test_ref_D_prophet_predicts_one_step_after_last_row(
    step_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[datetime] = []
    real_predict = Prophet.predict

    def spy(self: Prophet, frame: Any = None, **kw: Any) -> Any:
        asked.extend(frame["ds"].dt.to_pydatetime())
        return real_predict(self, frame, **kw)

    monkeypatch.setattr(Prophet, "predict", spy)
    feed("prophet", [1, 2, 3, 4, 5, 6], step_s=step_s).predict_next()
    assert asked == [datetime(2024, 1, 1) + timedelta(seconds=6 * step_s)]


def test_ref_D_prophet_log1p_stores_log_and_recovers_value() -> None:
    p = feed("prophet", [99], log1p=True)
    assert isinstance(p, ProphetPredictor)
    assert [y for _, y in p.rows] == [math.log1p(99)]
    assert p.predict_next() == 99.0


# --- model failures: TrafficPredictor falls back to the last value and says why ---------------------


def _raise_boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("boom")


@dataclass(frozen=True)
class FailureCase:
    name: str
    why: str
    kind: str
    patch: tuple[object, str]  # (owner, attribute) replaced by a function raising RuntimeError("boom")


FAILURE_CASES = [
    FailureCase("arima_fit", "auto_arima raises", "arima", (pmdarima, "auto_arima")),
    FailureCase("kalman_predict", "the filter's predict step raises", "kalman", (KalmanFilter, "predict")),
    FailureCase("prophet_fit", "Prophet.fit raises", "prophet", (Prophet, "fit")),
]

HISTORY = [
    TrafficObservation(60.0, n, isl, osl)
    for n, isl, osl in [(30, 1000, 100), (35, 1100, 90), (38, 900, 120), (40, 1200, 80), (42, 950, 110)]
]


@pytest.mark.parametrize("case", FAILURE_CASES, ids=lambda c: c.name)
def test_failing_model_falls_back_to_last_value(case: FailureCase, monkeypatch: pytest.MonkeyPatch) -> None:
    traffic = TrafficPredictor(case.kind, {})
    assert traffic.warm(HISTORY) == 5
    owner, attribute = case.patch
    with monkeypatch.context() as m:
        m.setattr(owner, attribute, _raise_boom)
        with pytest.raises(RuntimeError, match="boom"):
            traffic.predictors["num_req"].predict_next()  # the Protocol's predict_next may raise
        forecast = traffic.forecast()
    assert forecast == TrafficForecast(
        num_req=42.0,
        isl=950.0,
        osl=110.0,
        notes=(
            f"num_req: {case.kind} predict failed (RuntimeError: boom): using last value 42.0",
            f"isl: {case.kind} predict failed (RuntimeError: boom): using last value 950.0",
            f"osl: {case.kind} predict failed (RuntimeError: boom): using last value 110.0",
        ),
    ), case.why
    # The library works again: the next forecast is the model's own (refitted / re-initialised).
    traffic.observe(TrafficObservation(60.0, 44, 1000, 100))
    recovered = traffic.forecast()
    assert recovered is not None and recovered.notes == (), case.why


def test_non_finite_forecast_is_a_noted_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pmdarima, "auto_arima", lambda values, **kw: StubModel((1, 0, 0), NAN))
    traffic = TrafficPredictor("arima", {})
    traffic.warm(HISTORY)
    forecast = traffic.forecast()
    assert forecast is not None
    assert (forecast.num_req, forecast.notes[0]) == (
        42.0,
        "num_req: arima predict failed (ValueError: arima produced a non-finite forecast (nan)): "
        "using last value 42.0",
    )


# --- make_predictor -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MakeCase:
    name: str
    why: str
    kind: str
    params: dict[str, object]
    expected: str | Callable[[SeriesPredictor], bool]  # error message, or a check of the result


MAKE_CASES = [
    MakeCase(
        "unknown_kind",
        "names the kind and the known ones",
        "lstm",
        {},
        "unknown predictor 'lstm'; known: arima, constant, kalman, prophet",
    ),
    MakeCase(
        "unknown_param",
        "names the parameter and what is accepted",
        "kalman",
        {"q": 1.0},
        "unknown parameter 'q' for predictor 'kalman'; accepted: log1p, min_points, q_level, q_trend, r",
    ),
    MakeCase(
        "constant_takes_nothing",
        "constant has no parameters",
        "constant",
        {"window": 5},
        "unknown parameter 'window' for predictor 'constant'; accepted: none",
    ),
    MakeCase(
        "bool_param_wrong_type",
        "a string is not a boolean",
        "arima",
        {"log1p": "yes"},
        "predictor 'arima': parameter 'log1p' must be a boolean, got 'yes'",
    ),
    MakeCase(
        "bool_is_not_a_number",
        "True is not a noise level",
        "kalman",
        {"r": True},
        "predictor 'kalman': parameter 'r' must be a number, got True",
    ),
    MakeCase(
        "nan_is_not_a_number",
        "a NaN parameter would poison the filter",
        "kalman",
        {"q_level": NAN},
        "predictor 'kalman': parameter 'q_level' must be a number, got nan",
    ),
    MakeCase(
        "float_window",
        "window counts points",
        "prophet",
        {"window": 50.5},
        "predictor 'prophet': parameter 'window' must be an integer, got 50.5",
    ),
    MakeCase(
        "min_points_zero",
        "at least one point",
        "arima",
        {"min_points": 0},
        "predictor 'arima': parameter 'min_points' must be >= 1, got 0",
    ),
    MakeCase(
        "prophet_min_points_one",
        "Prophet cannot fit one row",
        "prophet",
        {"min_points": 1},
        "predictor 'prophet': parameter 'min_points' must be >= 2 (Prophet needs 2 rows)",
    ),
    MakeCase(
        "prophet_window_below_min_points",
        "a window smaller than the minimum would fit on fewer points than the minimum",
        "prophet",
        {"window": 3},
        "predictor 'prophet': parameter 'window' (3) must be >= min_points (5)",
    ),
    MakeCase(
        "negative_noise",
        "variances are not negative",
        "kalman",
        {"q_trend": -0.1},
        "predictor 'kalman': parameter 'q_trend' must be >= 0.0, got -0.1",
    ),
    MakeCase(
        "zero_step",
        "Prophet rows need distinct dates",
        "prophet",
        {"step_s": 0},
        "predictor 'prophet': parameter 'step_s' must be > 0, got 0",
    ),
    MakeCase(
        "kalman_defaults",
        "reference defaults: q_level 1.0, q_trend 0.1, r 10.0, min_points 5",
        "kalman",
        {},
        lambda p: (
            isinstance(p, KalmanPredictor)
            and (p.q_level, p.q_trend, p.r, p.min_points) == (1.0, 0.1, 10.0, 5)
        ),
    ),
    MakeCase(
        "int_for_float",
        "an integer is accepted where a number is expected, stored as float",
        "kalman",
        {"r": 5, "min_points": 3, "log1p": True},
        lambda p: (
            isinstance(p, KalmanPredictor)
            and (p.r, p.min_points, p.log1p) == (5.0, 3, True)
            and isinstance(p.r, float)
        ),
    ),
    MakeCase(
        "prophet_defaults",
        "reference default window 50, min points 5",
        "prophet",
        {},
        lambda p: isinstance(p, ProphetPredictor) and (p.window, p.min_points, p.log1p) == (50, 5, False),
    ),
    MakeCase(
        "arima_defaults",
        "raw mode, min points 5",
        "arima",
        {},
        lambda p: isinstance(p, ArimaPredictor) and (p.requested_log1p, p.min_points) == (False, 5),
    ),
]


@pytest.mark.parametrize("case", MAKE_CASES, ids=lambda c: c.name)
def test_make_predictor(case: MakeCase) -> None:
    if isinstance(case.expected, str):
        with pytest.raises(ValueError) as info:
            make_predictor(case.kind, case.params)
        assert str(info.value) == case.expected, case.why
        with pytest.raises(ValueError):  # TrafficPredictor builds through the same checks
            TrafficPredictor(case.kind, case.params)
    else:
        predictor = make_predictor(case.kind, case.params)
        assert isinstance(predictor, SeriesPredictor) and case.expected(predictor), case.why


# --- TrafficPredictor -----------------------------------------------------------------------------


def o(num_req: float | None, isl: float | None, osl: float | None) -> TrafficObservation:
    return TrafficObservation(duration_s=60.0, num_req=num_req, isl=isl, osl=osl)


@dataclass(frozen=True)
class TrafficCase:
    name: str
    why: str
    observations: list[TrafficObservation]
    expected: tuple[float, float, float] | None
    history_lens: dict[str, int]
    used: int


TRAFFIC_CASES = [
    TrafficCase(
        "nothing_observed", "no opinion before any traffic", [], None, {"num_req": 0, "isl": 0, "osl": 0}, 0
    ),
    TrafficCase(
        "missing_fields_skipped_per_series",
        "None and NaN skip only their own series",
        [o(10, None, 100), o(20, 500, NAN)],
        (20.0, 500.0, 100.0),
        {"num_req": 2, "isl": 1, "osl": 1},
        2,
    ),
    TrafficCase(
        "sizes_never_seen",
        "request counts alone are not a forecast: ISL/OSL unknown",
        [o(10, None, None)],
        None,
        {"num_req": 1, "isl": 0, "osl": 0},
        1,
    ),
    TrafficCase(
        "idle_interval_keeps_sizes",
        "with no requests the interval's ISL/OSL (0, None or NaN) say nothing about sizes",
        [o(10, 500, 50), o(0, 0, 0), o(0, None, NAN)],
        (0.0, 500.0, 50.0),
        {"num_req": 3, "isl": 1, "osl": 1},
        3,
    ),
    TrafficCase(
        "leading_idle_skipped",
        "idle intervals before the first request feed nothing",
        [o(0, None, None), o(0, 0, 0), o(5, 100, 10)],
        (5.0, 100.0, 10.0),
        {"num_req": 1, "isl": 1, "osl": 1},
        1,
    ),
    TrafficCase(
        "unknown_count_keeps_sizes",
        "an unknown request count does not discard the sizes that were measured",
        [o(None, 100, 10), o(5, None, None), o(NAN, NAN, 12)],
        (5.0, 100.0, 12.0),
        {"num_req": 1, "isl": 1, "osl": 2},
        3,
    ),
    TrafficCase(
        "nothing_usable",
        "all-unknown observations are not counted as used",
        [o(None, None, None), o(NAN, INF, -1)],
        None,
        {"num_req": 0, "isl": 0, "osl": 0},
        0,
    ),
]


@pytest.mark.parametrize("case", TRAFFIC_CASES, ids=lambda c: c.name)
def test_traffic_predictor(case: TrafficCase) -> None:
    observed = TrafficPredictor("constant", {})
    for obs in case.observations:
        observed.observe(obs)
    warmed = TrafficPredictor("constant", {})
    assert warmed.warm(case.observations) == case.used, case.why

    for traffic in (observed, warmed):
        forecast = traffic.forecast()
        got = None if forecast is None else (forecast.num_req, forecast.isl, forecast.osl)
        assert got == case.expected, case.why
        assert traffic.history_lens == case.history_lens, case.why
        assert traffic.history_len == case.history_lens["num_req"], case.why


def test_traffic_predictor_counts_ignored_values() -> None:
    traffic = TrafficPredictor("constant", {})
    for obs in [o(10, NAN, 5), o(INF, 100, NAN), o(NAN, 100, 5)]:
        traffic.observe(obs)
    assert traffic.ignored_non_finite == {"num_req": 2, "isl": 1, "osl": 1}


def test_traffic_predictor_notes_fallback_below_min_points() -> None:
    traffic = TrafficPredictor("kalman", {"min_points": 3})
    traffic.warm([o(10, 100, 10), o(20, 200, None)])
    assert traffic.forecast() == TrafficForecast(
        num_req=20.0,
        isl=200.0,
        osl=10.0,
        notes=(
            "num_req: kalman: 2 of 3 points, using last value 20.0",
            "isl: kalman: 2 of 3 points, using last value 200.0",
            "osl: kalman: 1 of 3 points, using last value 10.0",
        ),
    )


def test_warm_rearms_idle_skip() -> None:
    traffic = TrafficPredictor("constant", {})
    assert traffic.warm([o(10, 500, 50), o(20, 600, 60)]) == 2
    traffic.observe(o(0, None, None))  # first live interval after start-up is quiet
    forecast = traffic.forecast()
    assert forecast is not None and (forecast.num_req, traffic.history_len) == (20.0, 2)
    traffic.observe(o(3, 400, 40))
    traffic.observe(o(0, None, None))  # live traffic seen: zero is real again
    forecast = traffic.forecast()
    assert forecast is not None and (forecast.num_req, forecast.isl, traffic.history_len) == (0.0, 400.0, 4)
