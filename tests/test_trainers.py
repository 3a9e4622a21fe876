"""Trainer side: encoder, metrics, gate, a contract suite over every model, the incremental loop."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.core.config import TrainerConfig
from pipeline.core.events import Impression
from pipeline.core.types import Learner
from trainers.calibration import cross_fitted_shift, fit_shift
from trainers.encoding import MISSING, Encoder, stable_hash
from trainers.gate import gate, paired_allowance
from trainers.incremental import BlockScores, IncrementalTrainer
from trainers.learner import TorchLearner
from trainers.metrics import auc, block_metrics, calibration, example_loglosses, logloss, normalized_entropy
from trainers.models import MODELS
from trainers.testing import InMemoryModelStore, synthetic_examples

BUCKETS = 1 << 14


def small_cfg(model: str = "deepfm", **kw: object) -> TrainerConfig:
    base: dict[str, object] = dict(
        model=model,
        hash_buckets=BUCKETS,
        embedding_dim=8,
        hidden=(32, 16),
        batch_size=256,
        lr_dense=3e-3,
        lr_sparse=5e-2,
        device="cpu",
        train_every=2_000,
        holdout_fraction=0.2,
        seed=3,
    )
    base.update(kw)
    return TrainerConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def train_set():
    return synthetic_examples(6_000, seed=1)


@pytest.fixture(scope="module")
def test_set():
    return synthetic_examples(3_000, seed=2)


def learner(model: str, rows, **kw: object) -> TorchLearner:
    return TorchLearner(small_cfg(model, **kw), Encoder.for_trainer(small_cfg(model, **kw)).fit(rows))


# -- encoder ---------------------------------------------------------------------------------------
def test_stable_hash_is_the_same_in_another_process(train_set):
    enc = Encoder(BUCKETS).fit(train_set[:100])
    here = enc.encode(train_set[:20]).ids.tolist()
    code = (
        "import json; from trainers.encoding import Encoder, stable_hash; "
        "from trainers.testing import synthetic_examples; "
        f"e = Encoder.from_spec(json.loads({json.dumps(json.dumps(enc.spec()))})); "
        "ids = e.encode(synthetic_examples(6000, seed=1)[:20]).ids.tolist(); "
        "print(json.dumps([stable_hash('site=site3', 1000), ids]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")  # a different str hash() salt than ours
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    h, ids = json.loads(out.stdout)
    assert h == stable_hash("site=site3", 1000)
    assert ids == here


def test_encoder_schema_missing_and_unknown_fields():
    imp = Impression("i", 1, "u1", "a1", {"site": "news", "device": "ios"}, {"price": 2.0})
    enc = Encoder(BUCKETS).fit([(imp, {"user_ctr_1h": 0.1, "user_impressions_1h": 3.0})])
    assert enc.fields == ["user_id", "item_id", "device", "site"]
    assert enc.dense_names == ["price", "user_ctr_1h", "user_impressions_1h"]
    bare = Impression("j", 2, "u1", "a1", {"site": "news", "brand_new": "x"})  # no device, one unknown
    batch = enc.encode([(imp, {"user_ctr_1h": 0.1, "user_impressions_1h": 3.0}), (bare, {})])
    assert batch.ids[1, 2] == stable_hash(f"device={MISSING}", BUCKETS)
    assert batch.ids[1, 3] == batch.ids[0, 3] == stable_hash("site=news", BUCKETS)
    assert batch.ids.shape == (2, 4) and (batch.ids < BUCKETS).all()
    # rates raw, counts log1p, missing 0
    np.testing.assert_allclose(batch.dense[0], [math.log1p(2.0), 0.1, math.log1p(3.0)], rtol=1e-6)
    assert batch.dense[1].tolist() == [0.0, 0.0, 0.0]


def test_a_serving_request_encodes_as_its_rows():
    """``encode_request`` (user and context hashed once per request) equals ``encode`` of the rows
    the request stands for: repeated and unseen items, a missing and an unknown context field,
    dense inputs present, partial, non-finite or absent, stream features partial or absent."""
    imp = Impression("i", 1, "u1", "a1", {"site": "news", "device": "ios"}, {"price": 2.0, "floor": 1.0})
    enc = Encoder(BUCKETS).fit([(imp, {"user_ctr_1h": 0.1, "item_impressions_1h": 3.0})])
    items = ["a1", "a2", "a1", "never-seen"]
    ctx = {"site": "sport", "brand_new": "x"}
    stream = [{"user_ctr_1h": 0.2}, {}, {"item_impressions_1h": 7.0, "user_ctr_1h": 0.3}, {"other": 1.0}]
    for dense in (None, [{"price": 1.5}, {}, {"floor": float("nan")}, {"price": -4.0, "floor": 2.0}]):
        rows = [
            Impression("request", 0, "u_9", item, ctx, {} if dense is None else dense[k])
            for k, item in enumerate(items)
        ]
        want = enc.encode(list(zip(rows, stream, strict=True)))
        got = enc.encode_request("u_9", items, ctx, dense, stream)
        assert np.array_equal(got.ids, want.ids) and np.array_equal(got.dense, want.dense)
        assert got.labels is None
    with pytest.raises(ValueError, match="4 items, 3 feature rows"):
        enc.encode_request("u_9", items, ctx, None, stream[:3])


def test_encoder_spec_round_trip(train_set):
    enc = Encoder(BUCKETS).fit(train_set[:500])
    twin = Encoder.from_spec(json.loads(json.dumps(enc.spec())))
    a, b = enc.encode(train_set[:300]), twin.encode(train_set[:300])
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.dense, b.dense)
    with pytest.raises(RuntimeError):
        Encoder(BUCKETS).encode(train_set[:1])


# -- metrics and gate ------------------------------------------------------------------------------
def test_metrics_against_hand_computed_values():
    y, p = np.array([0, 1, 0, 1]), np.array([0.2, 0.2, 0.1, 0.9])
    assert auc(y, p) == pytest.approx(3.5 / 4)  # one tied pair counts one half
    assert math.isnan(auc(np.array([1, 1]), np.array([0.3, 0.4])))
    y2, p2 = np.array([1, 0]), np.array([0.8, 0.4])
    ll = -(math.log(0.8) + math.log(0.6)) / 2
    assert logloss(y2, p2) == pytest.approx(ll)
    assert normalized_entropy(y2, p2) == pytest.approx(ll / math.log(2))
    assert calibration(y2, p2) == pytest.approx(0.6 / 0.5)
    assert logloss(np.array([1]), np.array([0.0])) == pytest.approx(-math.log(1e-7))  # clipped
    m = block_metrics(np.array([0, 0]), np.array([0.1, 0.2]))
    assert m["positives"] == 0 and math.isnan(m["auc"]) and math.isnan(m["calibration"])


def test_gate_rules():
    good = {"logloss": 0.30, "auc": 0.7, "count": 10.0, "positives": 3.0}
    assert gate(good, None, 0.01).accepted
    assert gate(good, {"logloss": 0.2971}, 0.01).accepted  # 0.30 <= 0.2971 * 1.01
    assert not gate(good, {"logloss": 0.2900}, 0.01).accepted
    assert not gate(good | {"logloss": math.nan}, None, 0.01).accepted
    assert not gate(good | {"train_loss": math.inf}, {"logloss": 1.0}, 0.01).accepted
    assert not gate(good | {"auc": math.nan}, None, 0.01).accepted  # two classes: nan auc is a defect
    one_class = {"logloss": 0.1, "auc": math.nan, "ne": math.nan, "count": 5.0, "positives": 0.0}
    assert gate(one_class, None, 0.01).accepted  # undefined by the data, not a broken model


def _scores(n: int, seed: int, spread: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels at ~17% CTR, a champion's scores, and a candidate's: the champion's moved by noise."""
    rng = np.random.default_rng(seed)
    z = rng.normal(-1.6, 0.6, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(float)
    champion = 1 / (1 + np.exp(-z))
    candidate = 1 / (1 + np.exp(-(z + rng.normal(0.0, spread, n))))
    return y, candidate, champion


def test_gate_refuses_only_what_chance_does_not_explain():
    # 200 held-out rows (a 2,000-row block's tenth): a candidate the champion beats by a few
    # thousandths of logloss, which another 200 rows could reverse.
    y, cand, champ = _scores(200, seed=3, spread=0.35)
    c, h = block_metrics(y, cand), block_metrics(y, champ)
    assert h["logloss"] * 1.01 < c["logloss"] < h["logloss"] * 1.05  # worse beyond the tolerance alone
    allowance = paired_allowance(y, cand, champ, 0.95)
    assert not gate(c, h, 0.01).accepted  # the point estimates alone refused it
    decision = gate(c, h, 0.01, allowance=allowance)
    assert decision.accepted and "(chance)" in decision.reason
    assert paired_allowance(y, cand, champ, 0.5) == 0.0  # confidence 0.5: the old rule
    # The same kind of candidate on 50,000 rows: the allowance shrinks as 1 / sqrt(n), and a
    # candidate really worse is refused.
    y, cand, champ = _scores(50_000, seed=3, spread=0.35)
    c, h = block_metrics(y, cand), block_metrics(y, champ)
    allowance_large = paired_allowance(y, cand, champ, 0.95)
    assert allowance_large < allowance / 10
    refused = gate(c, h, 0.01, allowance=allowance_large)
    assert not refused.accepted and refused.kind == "worse_than_champion"
    # A broken candidate is refused on any holdout, and a non-finite score allows nothing.
    y, _, champ = _scores(200, seed=4, spread=0.0)
    broken = np.where(y > 0.5, 0.01, 0.99)
    assert not gate(
        block_metrics(y, broken),
        block_metrics(y, champ),
        0.01,
        allowance=paired_allowance(y, broken, champ, 0.95),
    ).accepted
    assert paired_allowance(y, np.full(200, np.nan), champ, 0.95) == 0.0


def test_gate_allows_for_the_labels_chance_on_a_holdout_without_clicks():
    # Open Bandit's random/women log: the click rate rose from ~0.17% to ~0.35%; the candidate that
    # learned it met a 200-row holdout without a click, where any lower prediction wins, and the
    # rows' paired differences, all alike, said "no doubt": the block was refused and the champion
    # served the next two blocks at a third of the observed rate.
    y = np.zeros(200)
    cand, champ = np.full(200, 0.0035), np.full(200, 0.0017)
    c, h = block_metrics(y, cand), block_metrics(y, champ)
    d = example_loglosses(y, cand) - example_loglosses(y, champ)
    sample_only = NormalDist().inv_cdf(0.95) * np.std(d, ddof=1) / np.sqrt(len(d))
    assert not gate(c, h, 0.01, allowance=sample_only).accepted  # the rule before
    assert gate(c, h, 0.01, allowance=paired_allowance(y, cand, champ, 0.95)).accepted
    # ... yet with rows enough, the same rare clicks refuse a candidate three times too high
    rng = np.random.default_rng(5)
    y = (rng.random(50_000) < 0.003).astype(float)
    cand, champ = np.full(50_000, 0.009), np.full(50_000, 0.003)
    refused = gate(
        block_metrics(y, cand),
        block_metrics(y, champ),
        0.01,
        allowance=paired_allowance(y, cand, champ, 0.95),
    )
    assert not refused.accepted and refused.kind == "worse_than_champion"


# -- contract suite over every model ---------------------------------------------------------------
@pytest.fixture(params=sorted(MODELS))
def model_name(request):
    return request.param


def test_implements_the_learner_protocol(model_name, train_set):
    assert isinstance(learner(model_name, train_set[:10]), Learner)


def test_inputs_not_mutated(model_name, train_set):
    data = train_set[:1_000]
    before = [ex.to_json() for ex in data]
    lrn = learner(model_name, data)
    lrn.learn(data)
    lrn.predict(data)
    assert [ex.to_json() for ex in data] == before


def test_same_seed_same_result(model_name, train_set, test_set):
    a, b = learner(model_name, train_set), learner(model_name, train_set)
    a.learn(train_set[:2_000]), b.learn(train_set[:2_000])
    pa = a.predict(test_set)
    assert np.array_equal(pa, b.predict(test_set))
    assert np.array_equal(pa, a.predict(test_set))  # scoring twice: bit-identical


def test_save_load_round_trip(model_name, train_set, test_set, tmp_path):
    a = learner(model_name, train_set)
    a.learn(train_set[:2_000])
    b = TorchLearner.load(a.save(tmp_path / "m"))
    assert np.array_equal(a.predict(test_set), b.predict(test_set))
    a.learn(train_set[2_000:3_000]), b.learn(train_set[2_000:3_000])  # optimizer state round-trips too
    assert np.array_equal(a.predict(test_set), b.predict(test_set))
    spec = json.loads((tmp_path / "m" / "spec.json").read_text())
    assert spec["model"]["type"] == model_name


def test_clone_is_independent(model_name, train_set, test_set):
    a = learner(model_name, train_set)
    before = a.predict(test_set)
    b = a.clone()
    b.learn(train_set[:1_000])
    assert np.array_equal(a.predict(test_set), before)
    assert not np.array_equal(b.predict(test_set), before)
    with pytest.raises(RuntimeError):
        a.clone(frozen=True).learn(train_set[:10])


def test_learning_improves_logloss_on_unseen_data(model_name, train_set, test_set):
    lrn = learner(model_name, train_set)
    y = np.array([ex.label for ex in test_set])
    before = logloss(y, lrn.predict(test_set))
    for _ in range(2):
        lrn.learn(train_set)
    after = block_metrics(y, lrn.predict(test_set))
    base_rate_entropy = logloss(y, np.full(len(y), y.mean()))
    assert after["logloss"] < before and after["logloss"] < base_rate_entropy
    assert after["auc"] > 0.6


def test_predict_accepts_rows_pairs_and_new_or_missing_fields(model_name, train_set):
    lrn = learner(model_name, train_set)
    imps = [Impression("x", 1, "u_new", "item_new", {"brand_new": "x"}), train_set[0].impression]
    feats = [{}, train_set[0].stream_features]
    p = lrn.predict((imps, feats))
    assert p.shape == (2,) and np.isfinite(p).all() and ((p > 0) & (p < 1)).all()
    assert np.array_equal(p, lrn.predict(list(zip(imps, feats, strict=True))))
    assert np.array_equal(p, lrn.predict_rows(imps, feats))
    same_user = [Impression("request", 0, "u_new", item, {"brand_new": "x"}) for item in ("i1", "i2")]
    assert np.array_equal(
        lrn.predict_request("u_new", ["i1", "i2"], {"brand_new": "x"}, feats),
        lrn.predict_rows(same_user, feats),
    )


# -- incremental loop ------------------------------------------------------------------------------
def stream(n: int, seed: int = 11):
    return synthetic_examples(n, seed=seed)


def test_blocks_publish_with_lineage_and_move_the_alias():
    store = InMemoryModelStore()
    trainer = IncrementalTrainer(small_cfg("lr", gate_tolerance=1.0), store)
    data = stream(4_500)
    reports = trainer.add(data[:2_500], position={"offset": 2_500}) + trainer.add(
        data[2_500:], position={"offset": 4_500}
    )
    assert [r.index for r in reports] == [1, 2] and trainer.pending == 500
    first, second = reports
    assert first.static is None and second.static is not None and first.champion is None
    assert first.version == "1" and second.version == "2" and store.resolve("champion") == "2"
    assert store.lineages["2"]["parent_version"] == "1" and store.lineages["1"]["parent_version"] == "none"
    assert store.lineages["1"]["position"] == {"offset": 2_500}
    assert store.lineages["1"]["examples_after_position"] == 500
    assert first.event_time_min == data[0].impression.ts and first.examples == 2_000
    assert store.metrics["2"]["holdout.logloss"] == second.candidate["logloss"]
    assert store.metrics["2"]["intercept_refit"] == second.intercept_refit != 0.0
    assert trainer.flush() and trainer.pending == 0


def test_shift_on_holdout_moves_the_intercept_to_the_holdouts_click_rate():
    """``trainer.shift_on_holdout``: an accepted candidate carries the intercept that its holdout,
    scored before it learned it, asks for; the same blocks without it keep the identity."""
    off = {"gate_tolerance": 1.0, "learn_holdout": False, "intercept_gain": 0.0, "refit_intercept": False}
    plain = IncrementalTrainer(small_cfg("deepfm", **off), None)
    shifted = IncrementalTrainer(small_cfg("deepfm", **off, shift_on_holdout=True), None)
    data = stream(4_000)
    plain.add(data)
    [_, report] = shifted.add(data)
    assert plain.champion is not None and plain.champion.calibration == (1.0, 0.0)
    assert shifted.champion is not None and report.decision.accepted
    a, b = shifted.champion.calibration
    assert a == 1.0 and b != 0.0
    hold = sorted(data[2_000:], key=lambda ex: ex.impression.ts)[-400:]  # block 2: its newest fifth
    y = np.array([ex.label for ex in hold], dtype=np.float64)
    # learn_holdout off: the champion is the candidate as it scored its holdout, shift applied
    gap_plain = abs(plain.champion.predict(hold).mean() - y.mean())
    gap_shifted = abs(shifted.champion.predict(hold).mean() - y.mean())
    assert gap_shifted < gap_plain


@pytest.mark.parametrize("model", ["deepfm", "esmm"])
def test_refit_intercept_matches_the_holdouts_click_rate_after_the_candidate_learned_it(model):
    """``trainer.refit_intercept``: after an accepted candidate learned its holdout, its intercept is
    the one its holdout asks for (its mean probability there is the holdout's click rate); without
    it the intercept stays where the last steps left it."""
    base = {"gate_tolerance": 1.0, "intercept_gain": 0.0}
    plain = IncrementalTrainer(small_cfg(model, **base, refit_intercept=False), None)
    refit = IncrementalTrainer(small_cfg(model, **base), None)
    data = stream(4_000)
    plain.add(data)
    [first, report] = refit.add(data)
    assert plain.champion is not None and plain.champion.calibration == (1.0, 0.0)
    assert refit.champion is not None and report.decision.accepted
    assert refit.champion.calibration[0] == 1.0 and refit.champion.calibration[1] != 0.0
    # what each block's refit moved it by is reported (intercept_gain 0: nothing else moves it)
    assert first.intercept_refit + report.intercept_refit == pytest.approx(refit.champion.calibration[1])
    assert report.to_dict()["intercept_refit"] == report.intercept_refit
    hold = sorted(data[2_000:], key=lambda ex: ex.impression.ts)[-400:]  # block 2's holdout
    y = np.array([ex.label for ex in hold], dtype=np.float64)
    p = refit.champion.predict(hold) if model != "esmm" else refit.champion.predict_tasks(hold)[:, 0]
    assert p.mean() == pytest.approx(y.mean(), abs=2e-3)  # fit_shift's ridge keeps it a hair off
    q = plain.champion.predict(hold) if model != "esmm" else plain.champion.predict_tasks(hold)[:, 0]
    assert abs(q.mean() - y.mean()) > abs(p.mean() - y.mean())


def test_the_gate_judges_a_candidate_with_the_intercept_its_refit_will_give_it(monkeypatch):
    """With ``trainer.refit_intercept`` the gate scores the candidate with its intercept refitted,
    cross-fitted over the holdout (no row scored by a fit it took part in): a candidate whose training
    left its intercept 1.5 logits off is accepted, since the refit moves it back, and the holdout
    metrics it reports are those of the refitted scores. Without the refit the same candidate is
    refused on its logloss, as it would be served with that intercept."""
    learn = TorchLearner.learn

    def off_after_training(self: TorchLearner, batch: Any, **kw: Any) -> float:
        loss = learn(self, batch, **kw)
        if self.blocks_learned > 1 and kw.get("widen_range", True):  # the training pass, not the holdout's
            a, b = self.calibration
            self.calibration = (a, b + 1.5)
        return loss

    monkeypatch.setattr(TorchLearner, "learn", off_after_training)
    data = stream(4_000)
    reports = {}
    for refit in (True, False):
        cfg = small_cfg("deepfm", refit_intercept=refit, intercept_gain=0.0, online_offset=False)
        reports[refit] = IncrementalTrainer(cfg, None).add(data)[1]
    judged, unrefitted = reports[True], reports[False]
    assert judged.decision.accepted, judged.decision.reason
    assert not unrefitted.decision.accepted and unrefitted.decision.kind == "worse_than_champion"
    # 400 holdout rows: fit_shift's ridge (a few clicks' worth) keeps a little of the 1.5 logits
    assert 0.8 < judged.candidate["calibration"] < 1.25 < 2.0 < unrefitted.candidate["calibration"]
    # the same candidate either way: its holdout AUC is its own ranking's, the folds' shifts aside
    assert judged.candidate["auc"] == unrefitted.candidate["auc"]


def test_cross_fitted_shift_scores_no_row_by_a_fit_it_took_part_in():
    """Row ``i`` is in fold ``i % 10`` and shifted by the fit on the other folds only: changing one
    fold's labels moves every other fold's scores and leaves that fold's own scores alone."""
    rng = np.random.default_rng(5)
    z = rng.normal(-1.0, 1.0, 2_000)
    y = (rng.random(2_000) < 1 / (1 + np.exp(-z))).astype(np.float64)
    p = 1 / (1 + np.exp(-z))
    base = cross_fitted_shift(p, y)
    flipped = y.copy()
    flipped[3::10] = 1 - flipped[3::10]
    moved = cross_fitted_shift(p, flipped)
    assert np.array_equal(moved[3::10], base[3::10])
    others = np.arange(2_000) % 10 != 3
    assert not np.isclose(moved[others], base[others]).any()
    assert cross_fitted_shift(p[:1], y[:1]) == pytest.approx(p[:1])  # one row: nothing to fit on


def test_intercept_gain_moves_the_intercept_by_the_running_mean_of_the_served_scores_miss(tmp_path):
    """``trainer.intercept_gain``: a candidate's intercept moves by what the served (champion's)
    scores missed the click rate by on the block's older part, never its holdout: half of it at the
    first correction, a third at the second (the running mean), never less than the floor."""
    data = stream(6_000)
    block2 = sorted(data[2_000:4_000], key=lambda ex: ex.impression.ts)
    older = block2[:1_600]  # the gate's holdout is the newest fifth
    y = np.array([ex.label for ex in older], dtype=np.float64)
    first = IncrementalTrainer(small_cfg("deepfm", gate_tolerance=1.0, refit_intercept=False), None)
    first.add(data[:2_000])
    assert first.champion is not None
    z = first.champion.predict_logits(older)  # what block 2's served scores were, as logits
    # the first correction moves it half-way (the mean of the offset and a prior block at 0),
    # unless the floor asks for more; off: nothing
    for floor, share in ((0.0, 0.0), (0.1, 0.5), (0.8, 0.8)):
        cfg = small_cfg("deepfm", gate_tolerance=1.0, intercept_gain=floor, refit_intercept=False)
        trainer = IncrementalTrainer(cfg, None)
        reports = trainer.add(data[:4_000])
        assert all(r.decision.accepted for r in reports) and trainer.champion is not None
        a, b = trainer.champion.calibration
        assert a == 1.0 and b == pytest.approx(share * fit_shift(z, y), rel=1e-9, abs=1e-12)
        assert trainer.champion.intercept_corrections == (1 if floor else 0)
        assert TorchLearner.load(trainer.champion.save(tmp_path / str(floor))).calibration == (a, b)
    assert abs(fit_shift(z, y)) > 0.01  # the stream gives it something to correct
    # the second correction, with floor 0.1: a third of what block 3's served scores missed by
    older3 = sorted(data[4_000:], key=lambda ex: ex.impression.ts)[:1_600]
    y3 = np.array([ex.label for ex in older3], dtype=np.float64)
    trainer = IncrementalTrainer(
        small_cfg("deepfm", gate_tolerance=1.0, intercept_gain=0.1, refit_intercept=False), None
    )
    trainer.add(data[:4_000])
    assert trainer.champion is not None
    _, b2 = trainer.champion.calibration
    z3 = trainer.champion.predict_logits(older3) + b2  # served: calibrated, slope 1
    trainer.add(data[4_000:])
    assert trainer.champion.intercept_corrections == 2
    assert trainer.champion.calibration[1] == pytest.approx(b2 + fit_shift(z3, y3) / 3, rel=1e-9)


def test_trainer_is_deterministic_on_cpu():
    def run():
        trainer = IncrementalTrainer(small_cfg("deepfm"), None)
        return [(r.online, r.candidate, r.decision) for r in trainer.add(stream(4_000))]

    assert run() == run()


def test_examples_encoded_as_they_arrive_train_exactly_like_one_big_add():
    """The trainer encodes each add()'s examples on arrival; blocks must not depend on how they came."""
    data = stream(6_500)
    order = np.random.default_rng(5).permutation(len(data))
    data = [data[i] for i in order]  # out of impression-time order: the block's sort must still hold

    def run(chunk: int):
        trainer = IncrementalTrainer(small_cfg("deepfm"), None)
        reports = [r for i in range(0, len(data), chunk) for r in trainer.add(data[i : i + chunk])]
        reports += trainer.flush()
        return [(r.examples, r.online, r.candidate, r.train_loss, r.event_time_max) for r in reports]

    whole, pieces = run(len(data)), run(333)
    assert len(whole) == 4 and [w[0] for w in whole] == [2_000, 2_000, 2_000, 500]
    assert pieces == whole


def test_poisoned_candidate_is_refused_and_champion_stays(model_name, monkeypatch):
    store = InMemoryModelStore()
    trainer = IncrementalTrainer(small_cfg(model_name), store)
    data = stream(4_000)
    (first,) = trainer.add(data[:2_000])
    champion = trainer.champion
    assert first.decision.accepted and champion is not None
    scores = champion.predict(data[2_000:2_100])
    learn = TorchLearner.learn

    def poisoned(self: TorchLearner, examples: object, **kw: Any) -> float:
        loss = learn(self, examples, **kw)  # type: ignore[arg-type]
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(math.nan)
        return loss

    monkeypatch.setattr(TorchLearner, "learn", poisoned)
    (second,) = trainer.add(data[2_000:])
    assert not second.decision.accepted and "nan" in second.decision.reason
    assert second.version is None and store.versions() == ["1"] and store.resolve("champion") == "1"
    assert trainer.champion is champion and np.array_equal(champion.predict(data[2_000:2_100]), scores)


def test_trainer_resumes_from_the_store_champion():
    store = InMemoryModelStore()
    data = stream(4_000)
    IncrementalTrainer(small_cfg("lr"), store).add(data[:2_000])
    resumed = IncrementalTrainer(small_cfg("lr"), store)
    assert resumed.champion_version == "1" and resumed.has_champion
    (report,) = resumed.add(data[2_000:])
    assert report.parent_version == "1" and report.champion is not None


def test_report_is_json_able():
    (report,) = IncrementalTrainer(small_cfg("lr"), None).add(stream(2_000))
    d = report.to_dict()
    json.dumps(d)
    assert {f.name for f in dataclasses.fields(report)} <= set(d)


# -- DCN-V2 specifics (the contract suite above runs it like every model) ----------------------------
def test_a_small_block_is_learned_in_min_steps_and_its_holdout_in_the_same_batches(train_set):
    """min_steps: a block under min_steps * batch_size rows gets smaller batches; a large one not."""
    small = learner("deepfm", train_set, batch_size=512, min_steps=32)
    small.learn(train_set[:1_800])
    assert small.steps == 32  # batches of ceil(1800 / 32) = 57, not 4 of 512
    small.learn(train_set[1_800:2_000], block_rows=1_800)  # a holdout, in its block's batches
    assert small.steps == 32 + 4
    large = learner("deepfm", train_set, batch_size=128, min_steps=32)
    large.learn(train_set[:6_000])
    assert large.steps == 47  # 6,000 rows are 47 steps of 128 already
    off = learner("deepfm", train_set, batch_size=512, min_steps=0)
    off.learn(train_set[:1_800])
    assert off.steps == 4
    floored = learner("deepfm", train_set, batch_size=512, min_steps=128, min_batch_size=56)
    floored.learn(train_set[:1_800])
    assert floored.steps == 33  # 128 steps would be batches of 15: the floor makes them 56


def test_dcnv2_shares_the_hashed_embedding_and_records_its_cross_layers(train_set):
    from trainers.models import HashedEmbedding

    lrn = learner("dcnv2", train_set)
    assert isinstance(lrn.model.embedding, HashedEmbedding) and lrn.model.embedding.table.sparse
    assert lrn.model_spec["cross_layers"] == 3 and len(lrn.model.cross) == 3  # type: ignore[arg-type]
    assert "cross_layers" not in learner("deepfm", train_set).model_spec


# -- DIN specifics ---------------------------------------------------------------------------------
def test_din_attention_is_the_papers_mlp_over_q_k_products_and_differences():
    """The split first layer (:meth:`DIN._first_attention_layer`) is the MLP over the paper's
    ``[q, k, q*k, q-k]``, with the same weights; an empty sequence gives a zero interest."""
    from trainers.models import build_model, model_spec

    torch.manual_seed(3)
    spec = model_spec("din", n_fields=3, n_dense=0, hash_buckets=97, embedding_dim=4, sequence_length=5)
    m = build_model(spec).eval()
    ids = torch.randint(0, 97, (6, 3 + 5))
    ids[1, 3 + 2 :] = -1  # a short sequence
    ids[2, 3:] = -1  # none
    with torch.no_grad():
        v = m.embedding(ids[:, :3])
        k = m.embedding.field_vectors(ids[:, 3:], 1)
        q = v[:, 1].unsqueeze(1).expand_as(k)
        paper = m.attention(torch.cat([q, k, q * k, q - k], dim=2)).squeeze(2)
        split = m.attention[1:](m._first_attention_layer(v[:, 1], k)).squeeze(2)
        torch.testing.assert_close(split, paper)
        interest = m.interest(ids, v)
    torch.testing.assert_close(interest[1], (paper[1, :2].unsqueeze(1) * k[1, :2]).sum(0))
    assert interest[2].abs().max() == 0 and interest[0].abs().max() > 0


# -- FTRL-Proximal baseline ------------------------------------------------------------------------
def ftrl_data(train_set, test_set):
    enc = Encoder(BUCKETS).fit(train_set)
    return enc, enc.encode(train_set), enc.encode(test_set)


def test_ftrl_learns_unseen_data_and_is_deterministic(train_set, test_set):
    from trainers.ftrl import FtrlLearner

    enc, train, test = ftrl_data(train_set, test_set)
    a, b = FtrlLearner(BUCKETS), FtrlLearner(BUCKETS, encoder=enc)
    assert isinstance(a, Learner)
    assert np.all(a.predict(test) == 0.5)  # nothing learned yet: every coordinate is 0
    assert test.labels is not None
    prior = logloss(test.labels, np.full(len(test), test.labels.mean()))
    a.learn(train), b.learn(train_set)  # an EncodedBatch, or examples through the encoder
    p = a.predict(test)
    assert np.array_equal(p, b.predict(test_set))
    assert logloss(test.labels, p) < prior and auc(test.labels, p) > 0.6
    assert 0 < a.nonzero_weights < BUCKETS


def test_ftrl_per_example_and_minibatch_agree_roughly_and_inputs_are_checked(train_set, test_set):
    from trainers.ftrl import FtrlLearner

    _, train, test = ftrl_data(train_set, test_set)
    one, many = FtrlLearner(BUCKETS, batch_size=1), FtrlLearner(BUCKETS, batch_size=64)
    one.learn(train[:2_000]), many.learn(train[:2_000])
    assert test.labels is not None
    assert abs(auc(test.labels, one.predict(test)) - auc(test.labels, many.predict(test))) < 0.03
    with pytest.raises(ValueError, match="dense inputs"):
        one.predict(test[:5].__class__(test.ids[:5], test.dense[:5, :1]))
    with pytest.raises(ValueError, match="no labels"):
        one.learn(test[:5].__class__(test.ids[:5], test.dense[:5]))
    with pytest.raises(TypeError, match="encoder"):
        one.predict(test_set[:5])


# -- baselines inside the incremental loop ---------------------------------------------------------
def test_baselines_are_scored_on_the_same_blocks_before_learning_them():
    from trainers.ftrl import FtrlLearner

    seen: list[BlockScores] = []
    ftrl = FtrlLearner(BUCKETS)
    trainer = IncrementalTrainer(small_cfg("lr"), None, baselines={"ftrl": ftrl}, on_scores=seen.append)
    first, second = trainer.add(stream(4_000))
    assert first.baselines["ftrl"]["auc"] == 0.5  # block 1: nothing learned, every score 0.5
    assert second.baselines["ftrl"]["count"] == second.examples and ftrl.examples_learned == 4_000
    assert [sorted(s.scores) for s in seen] == [["ftrl", "online"], ["ftrl", "online", "static"]]
    assert block_metrics(seen[1].labels, seen[1].scores["ftrl"]) == second.baselines["ftrl"]
    assert block_metrics(seen[1].labels, seen[1].scores["static"]) == second.static
    with pytest.raises(ValueError, match="online"):
        IncrementalTrainer(small_cfg("lr"), None, baselines={"online": ftrl})
