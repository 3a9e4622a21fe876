"""Clicks and conversions: ESMM, its loss and metrics, corrections kept from click models, the gate.

The stream is what the joiner emits with conversions joined (:mod:`pipeline.core.events`): a
never-clicked impression once (click 0, conversion 0), a clicked one twice (click 1 with its
conversion unknown, then a conversion window later its correction with the final conversion).
Conversion depends on the item: a third of the items convert 60% of their clicks, the rest 5%.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
import torch

from pipeline.core.config import TrainerConfig
from pipeline.core.events import Impression, LabelledExample
from trainers.encoding import EncodedBatch, Encoder
from trainers.gate import GateDecision
from trainers.incremental import BlockScores, IncrementalTrainer
from trainers.learner import TASKS_SCORER_FILE, TorchLearner
from trainers.metrics import auc, block_metrics
from trainers.models import build_model, is_multi_task, model_spec
from trainers.multitask import both_tasks, conversion_gate, conversion_metrics, multitask_loss
from trainers.testing import small_trainer_config, synthetic_examples

CONVERSION_WINDOW_MS = 100_000  # a correction arrives ~1,000 impressions after its click


def converts(item_id: str) -> float:
    return 0.6 if int(item_id.removeprefix("item")) % 3 == 0 else 0.05


def conversion_stream(n: int, seed: int = 11) -> list[LabelledExample]:
    """``n`` impressions as the joiner emits them with conversions joined, in arrival order."""
    rng = np.random.default_rng(seed + 100)
    arrivals: list[tuple[int, int, LabelledExample]] = []
    for k, ex in enumerate(synthetic_examples(n, seed=seed)):
        if not ex.label:
            arrivals.append((ex.label_ts, 2 * k, msgspec.structs.replace(ex, conversion=0)))
            continue
        arrivals.append((ex.label_ts, 2 * k, ex))  # clicked: the conversion is not known yet
        end = ex.label_ts + CONVERSION_WINDOW_MS
        converted = int(rng.random() < converts(ex.impression.item_id))
        correction = msgspec.structs.replace(ex, label_ts=end, conversion=converted, correction=True)
        arrivals.append((end, 2 * k + 1, correction))
    return [ex for _, _, ex in sorted(arrivals, key=lambda a: (a[0], a[1]))]


def cfg(model: str = "esmm", **kw: object) -> TrainerConfig:
    """testing's small trainer (blocks of 2,000, every finite candidate accepted), smaller still."""
    small = dict(hash_buckets=1 << 12, embedding_dim=4, hidden=(16, 8), batch_size=128, seed=5)
    return small_trainer_config(**(small | {"model": model, "conversion_gate_tolerance": 1.0} | kw))


def learner(c: TrainerConfig, data: list[LabelledExample]) -> TorchLearner:
    return TorchLearner(c, Encoder.for_trainer(c).fit(data))


@pytest.fixture(scope="module")
def stream() -> list[LabelledExample]:
    return conversion_stream(5_000)


# -- the model ---------------------------------------------------------------------------------------
def test_esmm_forward_is_the_click_logit_and_task_logits_add_the_conversion_logit() -> None:
    assert is_multi_task("esmm") and not is_multi_task("deepfm")
    spec = model_spec("esmm", n_fields=3, n_dense=2, hash_buckets=64, embedding_dim=4, hidden=(8,))
    torch.manual_seed(0)
    m = build_model(spec)
    torch.manual_seed(0)
    deepfm = build_model(spec | {"type": "deepfm"})
    ids, dense = torch.randint(0, 64, (5, 3)), torch.rand(5, 2)
    out, tasks = m(ids, dense), m.task_logits(ids, dense)
    assert out.shape == (5,) and tasks.shape == (5, 2)
    assert torch.equal(tasks[:, 0], out)
    assert torch.equal(out, deepfm(ids, dense))  # the click tower starts as DeepFM, seed for seed
    assert torch.equal(tasks[:, 1], torch.zeros(5))  # the conversion tower starts at 0 (its bias)


def test_esmm_starts_as_deepfm_and_at_the_first_conversions_per_click(stream) -> None:
    """Learning nothing (rates ~0): pCTR is DeepFM's start (its output bias at the block's smoothed
    click rate, over the rows that are not corrections), pCVR the smoothed conversions per click of
    the block's corrections; and a block without any does not set it, nor a block of the stream's
    first conversion window, whose corrections trail its clicks (175 for 409 clicks here)."""
    still = {"lr_dense": 1e-12, "lr_sparse": 1e-12, "lr_wide": 1e-12}
    block = stream[2_000:4_000]
    plain = [ex for ex in block if not ex.correction]
    esmm, deepfm = learner(cfg(**still), block), learner(cfg("deepfm", **still), block)
    esmm.learn(block), deepfm.learn(plain)
    p = esmm.predict_tasks(block)
    np.testing.assert_allclose(p[:, 0], deepfm.predict(block), rtol=1e-6)
    assert np.array_equal(p[:, 0], esmm.predict(block))
    known = [ex.conversion or 0 for ex in block if ex.correction]
    assert known, "the block should hold corrections"
    np.testing.assert_allclose(p[:, 1], (sum(known) + 1) / (len(known) + 2), rtol=1e-5)
    fresh = learner(cfg(**still), block)
    fresh.learn(plain)  # conversions known only for never-clicked impressions: no rate yet
    np.testing.assert_allclose(fresh.predict_tasks(block)[:, 1], 0.5, atol=1e-6)
    fresh.learn(stream[:2_000])  # the first window: corrections trailing
    np.testing.assert_allclose(fresh.predict_tasks(block)[:, 1], 0.5, atol=1e-6)


# -- encoding and the loss ------------------------------------------------------------------------
def test_encoded_batches_carry_conversions_and_corrections(stream) -> None:
    enc = Encoder(1 << 10).fit(stream[:100])
    batch = enc.encode(stream[:3_000])
    assert batch.conversions is not None and batch.corrections is not None
    want = [math.nan if ex.conversion is None else ex.conversion for ex in stream[:3_000]]
    np.testing.assert_array_equal(batch.conversions, np.array(want, dtype=np.float32))
    assert batch.corrections.tolist() == [ex.correction for ex in stream[:3_000]]
    again = EncodedBatch.concat([batch[:10], enc.encode(synthetic_examples(5)), batch[10:20]])
    assert again.conversions is not None and np.isnan(again.conversions[10:15]).all()
    assert again.corrections is not None and not again.corrections[10:15].any()
    assert np.array_equal(again.first_columns(2).corrections, again.corrections)  # type: ignore[arg-type]
    click_only = enc.encode(synthetic_examples(5))
    assert click_only.conversions is None and click_only.corrections is None
    assert len(batch.without_corrections()) == sum(not ex.correction for ex in stream[:3_000])


def test_the_loss_is_click_bce_off_corrections_plus_ctcvr_bce_where_known() -> None:
    logits = torch.tensor([[0.3, -1.0], [-2.0, 0.5], [1.0, 2.0], [40.0, 40.0]])
    labels = torch.tensor([1.0, 0.0, 1.0, 1.0])
    conv = torch.tensor([math.nan, 0.0, 1.0, 0.0])
    clicks = torch.tensor([1.0, 1.0, 0.0, 1.0])  # row 2 is a correction
    z = logits.double()
    click = torch.nn.functional.binary_cross_entropy_with_logits(z[:, 0], labels.double(), reduction="none")
    q = torch.sigmoid(z[:, 0]) * torch.sigmoid(z[:, 1])
    # row 3: pCTCVR rounds to 1; its log is clamped at -1e-6, so log(1 - p) = log(1 - e^-1e-6)
    want = click[[0, 1, 3]].sum() - (1 - q[1]).log() - q[2].log() - math.log(-math.expm1(-1e-6))
    got = multitask_loss(logits, labels, conv, clicks)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    grad = torch.zeros_like(logits, requires_grad=True)
    multitask_loss(logits + grad, labels, conv, clicks).backward()
    assert grad.grad is not None and torch.isfinite(grad.grad).all()  # pCTCVR near 1 stays finite


# -- click models never learn a correction ------------------------------------------------------------
def test_deepfm_learns_the_same_with_or_without_corrections(stream) -> None:
    plain = [ex for ex in stream[:3_000] if not ex.correction]
    a, b = learner(cfg("deepfm"), plain), learner(cfg("deepfm"), plain)
    a.learn(stream[:3_000])
    b.learn(plain)
    for (name, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert a.steps == b.steps


def test_a_click_model_drops_corrections_before_the_block_and_counts_them(stream) -> None:
    plain = [ex for ex in stream if not ex.correction]
    seen: list[BlockScores] = []
    with_corr = IncrementalTrainer(cfg("deepfm"), None, on_scores=seen.append)
    without = IncrementalTrainer(cfg("deepfm"), None)
    got = with_corr.add(stream[:2_500]) + with_corr.add(stream[2_500:])
    want = without.add(plain)
    assert [(r.online, r.candidate, r.decision) for r in got] == [
        (r.online, r.candidate, r.decision) for r in want
    ]
    skipped = len(stream) - len(plain)
    assert (
        with_corr.corrections_skipped == skipped >= sum(r.corrections_skipped for r in got)
    )  # some: buffered
    assert all(r.corrections == 0 for r in got) and got[0].corrections_skipped > 0
    assert all(len(s.labels) == r.examples for s, r in zip(seen, got, strict=True))


# -- the online loop with ESMM ----------------------------------------------------------------------
def run(data: list[LabelledExample], **kw: object) -> tuple[IncrementalTrainer, list]:
    seen: list[BlockScores] = []
    trainer = IncrementalTrainer(cfg(**kw), None, on_scores=seen.append)
    return trainer, list(zip(trainer.add(data), seen, strict=True))


def test_esmm_learns_conversions_and_click_metrics_exclude_corrections() -> None:
    data = conversion_stream(12_000)
    trainer, blocks = run(data)
    for report, scores in blocks:
        n_corr = report.corrections
        assert n_corr > 0 and report.online["count"] == report.examples - n_corr == len(scores.labels)
        assert report.positives == report.online["positives"] == scores.labels.sum()
        assert {"cvr_auc", "cvr_logloss", "cvr_ne", "cvr_calibration", "cvr_examples"} <= set(report.online)
        assert report.candidate["cvr_examples"] > 0 and "cvr_clicked_auc" in report.candidate
    last = [report for report, _ in blocks[-3:]]
    assert all(r.decision.accepted for r in last)
    assert all(r.online["cvr_auc"] > 0.7 for r in last)  # pCTCVR over every impression of known conversion
    assert all(r.online["cvr_clicked_auc"] > 0.75 for r in last)  # pCVR among the clicked: the CVR tower
    # unseen data: the CVR tower ranks the converting items' clicks first
    test = [ex for ex in conversion_stream(6_000, seed=99) if ex.correction]
    assert trainer.champion is not None
    p_cvr = trainer.champion.predict_tasks(test)[:, 1]
    truth = np.array([converts(ex.impression.item_id) for ex in test])
    assert auc(truth > 0.5, p_cvr) > 0.9


def test_a_flushed_tail_of_corrections_only_is_scored_with_the_online_offset() -> None:
    """The end of a replay: the last clicks' corrections arrive after every click example, so the
    flushed block holds corrections only: no click row to fit an offset on, and none needed."""
    data = conversion_stream(4_000)
    trainer = IncrementalTrainer(cfg(), None, label_delay_ms=20_000, serves_offset=True)
    assert len(trainer.add(data)) == 2 and trainer.needed == 2_000  # both blocks closed
    pending = trainer.pending
    (tail,) = trainer.flush()
    assert tail.examples == tail.corrections == pending > 0 and tail.online["count"] == 0


def test_a_block_is_train_every_click_examples_whatever_the_model() -> None:
    """Corrections ride along: ESMM's blocks hold the same click examples as DeepFM's (the quality
    suite compares them block by block), and cut() says where the current block ends."""
    data = conversion_stream(9_000)
    esmm, deepfm = IncrementalTrainer(cfg(), None), IncrementalTrainer(cfg("deepfm"), None)
    assert sum(not ex.correction for ex in data[: esmm.cut(data)]) == esmm.needed
    got, want = [], []
    for part in (data[:1_234], data[1_234:5_000], data[5_000:]):
        got += esmm.add(part)
        want += deepfm.add([ex for ex in part if not deepfm.skips(ex)])
    assert [r.examples - r.corrections for r in got] == [r.examples for r in want]
    assert [r.positives for r in got] == [r.positives for r in want]
    assert sum(r.corrections for r in got) > 0 and esmm.needed == deepfm.needed


def test_esmm_runs_are_deterministic_on_cpu() -> None:
    data = conversion_stream(4_500)

    def once() -> list:
        return [(r.online, r.candidate, r.champion, r.decision, r.train_loss) for r, _ in run(data)[1]]

    assert once() == once()


def test_the_gate_refuses_a_candidate_worse_on_conversions_naming_the_task() -> None:
    """Every block's candidate must beat its champion's conversion logloss by half: none can."""
    _, blocks = run(conversion_stream(6_000), conversion_gate_tolerance=-0.5)
    first, *later = [r for r, _ in blocks]
    assert first.decision.accepted
    for r in later:
        assert r.champion is not None and r.champion["cvr_positives"] > 0
        assert not r.decision.accepted and r.decision.kind == "worse_on_conversions"
        assert r.decision.reason.startswith("conversion task: candidate cvr_logloss")


def test_conversion_gate_rules() -> None:
    cand = {"cvr_examples": 100.0, "cvr_positives": 5.0, "cvr_logloss": 0.101, "cvr_mean_prediction": 0.05}
    assert conversion_gate(cand, {"cvr_logloss": 0.100}, 0.01).accepted  # 0.101 <= 0.100 * 1.01
    worse = conversion_gate(cand, {"cvr_logloss": 0.0995}, 0.01)
    assert not worse.accepted and worse.kind == "worse_on_conversions"
    assert conversion_gate(cand, None, 0.01).accepted  # block 1: finite is enough
    broken = conversion_gate(cand | {"cvr_logloss": math.nan}, {"cvr_logloss": 0.1}, 1.0)
    assert not broken.accepted and broken.kind == "non_finite"
    skipped = conversion_gate(cand | {"cvr_positives": 0.0, "cvr_logloss": 9.0}, {"cvr_logloss": 0.1}, 0.01)
    assert skipped.accepted and "skipped" in skipped.reason
    assert "skipped" in conversion_gate({"cvr_examples": 0.0}, {"cvr_logloss": 0.1}, 0.01).reason
    click_refused = both_tasks(GateDecision(False, "logloss worse", "worse_than_champion"), worse)
    assert click_refused.reason == "click task: logloss worse" and click_refused.kind == "worse_than_champion"
    both = both_tasks(GateDecision(True, "ok"), GateDecision(True, "fine"))
    assert both.accepted and both.reason == "click task: ok; conversion task: fine"


def test_conversion_metrics_read_only_rows_of_known_conversion() -> None:
    labels = np.array([0.0, 1.0, 1.0, 1.0, 0.0])
    conv = np.array([0.0, np.nan, 1.0, 0.0, 0.0])
    p = np.array([[0.1, 0.3], [0.9, 0.9], [0.5, 0.6], [0.4, 0.2], [0.2, 0.5]])
    m = conversion_metrics(labels, conv, p)
    known = ~np.isnan(conv)
    want = block_metrics(conv[known], (p[:, 0] * p[:, 1])[known])
    assert m["cvr_examples"] == want["count"] == 4 and m["cvr_rate"] == want["ctr"]
    assert m["cvr_logloss"] == want["logloss"] and m["cvr_auc"] == want["auc"]
    assert m["cvr_clicked_auc"] == 1.0  # rows 2 and 3: pCVR 0.6 converted, 0.2 did not
    assert m["cvr_clicked_calibration"] == pytest.approx((0.6 + 0.2) / 2 / 0.5)  # pCVR's level there
    none = conversion_metrics(labels, None, p)
    assert none["cvr_examples"] == 0 and math.isnan(none["cvr_logloss"])


# -- persistence and serving ------------------------------------------------------------------------
def test_an_esmm_learner_round_trips_and_serves_both_probabilities(stream, tmp_path) -> None:
    a = learner(cfg(), stream)
    a.learn(stream[:3_000])
    b = TorchLearner.load(a.save(tmp_path / "m"))
    test = conversion_stream(300, seed=7)
    assert np.array_equal(a.predict_tasks(test), b.predict_tasks(test))
    a.learn(stream[3_000:]), b.learn(stream[3_000:])  # optimizer state too
    assert np.array_equal(a.predict_tasks(test), b.predict_tasks(test))
    clone = a.clone()
    assert np.array_equal(clone.predict_tasks(test), a.predict_tasks(test))

    assert a.use_inference("torchscript") == "torchscript"
    served = TorchLearner.load_for_serving(a.save_for_serving(tmp_path / "serve"))
    assert (tmp_path / "serve" / TASKS_SCORER_FILE).is_file() and served.inference == "torchscript"
    items, ctx = ["item3", "item4", "item_new"], {"site": "site1", "device": "dev0"}
    feats = [{"user_ctr_1h": 0.1}] * 3
    tasks = served.predict_request_tasks("u_1", items, ctx, feats)
    eager = b.predict_request_tasks("u_1", items, ctx, feats)
    assert tasks.shape == (3, 2)
    np.testing.assert_allclose(tasks, eager, rtol=0, atol=1e-6)
    np.testing.assert_allclose(
        tasks[:, 0], served.predict_request("u_1", items, ctx, feats), rtol=0, atol=1e-6
    )
    with pytest.raises(TypeError, match="one task"):
        learner(cfg("deepfm"), stream).predict_tasks(test)


def test_a_correction_keeps_the_place_it_arrived_in_within_its_block() -> None:
    """Not its old impression time (the block's oldest part) nor its emission time (the holdout):
    the time of the click example before it, so the holdout samples the impression space."""
    from trainers.incremental import _block_times

    def ex(ts: int, correction: bool = False) -> LabelledExample:
        return LabelledExample(Impression(f"i{ts}", ts, "u", "a"), 1, ts + 10**9, {}, 0, correction)

    block = [ex(5, True), ex(10), ex(12), ex(1, True), ex(11), ex(2, True)]
    assert _block_times(block).tolist() == [10, 10, 12, 12, 11, 11]
