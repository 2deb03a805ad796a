"""A forward pass with host syncs priced as a two-stage flow shop (dlperf.engine.stage.flow_shop / _flow_forward)."""

import pytest

from dlperf.engine.stage import StageCost, flow_shop


def test_flow_shop_hand_example():
    # host-heavy first: the device waits for the host, then runs the device-heavy job: 3 + 1 + 3 = ... max over i
    host_first = [(3.0, 1.0), (1.0, 3.0)]  # i=1: 3 + (1 + 3) = 7; i=2: 4 + 3 = 7
    device_first = [(1.0, 3.0), (3.0, 1.0)]  # i=1: 1 + 4 = 5; i=2: 4 + 1 = 5
    assert flow_shop(host_first) == pytest.approx(7.0)
    assert flow_shop(device_first) == pytest.approx(5.0)
    for jobs in (host_first, device_first):  # between max(H, D) and H + D
        h, d = sum(x for x, _ in jobs), sum(y for _, y in jobs)
        assert max(h, d) <= flow_shop(jobs) <= h + d


def test_flow_shop_monotone():
    jobs = [(0.2, 1.0), (3.0, 0.5), (0.1, 2.0), (1.0, 0.3)]
    base = flow_shop(jobs)
    for i in range(len(jobs)):
        for which in (0, 1):
            for factor in (0.5, 2.0):  # a faster (or slower) host or device never moves the time the other way
                changed = [tuple(v * factor if (j, k) == (i, which) else v for k, v in enumerate(job))
                           for j, job in enumerate(jobs)]
                assert (flow_shop(changed) <= base) if factor < 1 else (flow_shop(changed) >= base)


def test_pass_without_syncs_is_max_of_host_and_device():
    cost = StageCost(forward=2.0, host_fwd=3.0, backward=1.0, host_bwd=0.5)
    assert cost.flow_fwd is None
    assert cost.passes()[0] == 3.0 and cost.passes()[1] == 1.0
    synced = StageCost(forward=2.0, host_fwd=3.0, flow_fwd=4.0, ep_comm_fwd=0.5)
    assert synced.passes()[0] == pytest.approx(4.5)  # the flow shop plus the exposed all-to-all


def test_no_sync_plans_predict_as_before():
    """Every row whose stages have no host sync predicts exactly as without the flow shop."""
    from dlperf import validate
    from dlperf.engine import stage

    rows = [r for r in validate.load_dataset() if "moe" not in r.id and "gpt-oss" not in r.id][:8]
    original = stage._flow_forward
    seen = []
    def spy(sequence):
        seen.append(original(sequence))
        return seen[-1]
    try:
        stage._flow_forward = spy
        for row in rows:
            seen.clear()
            with_flow = validate._predict(row)[0].step_time_s
            if any(x is not None for x in seen):
                continue
            stage._flow_forward = lambda sequence: None
            assert validate._predict(row)[0].step_time_s == with_flow
            stage._flow_forward = spy
    finally:
        stage._flow_forward = original


def test_moe_ep_forward_at_least_max():
    """A dropless MoE row under expert parallelism: the all-to-all dispatcher's wait makes the forward a flow
    shop, no shorter than max(H, D)."""
    from dlperf import validate
    from dlperf.engine import stage

    row = {r.id: r for r in validate.load_dataset()}["mbridge-2602-qwen3-30b-a3b-b200-mxfp8"]
    original, seen = stage._flow_forward, []
    def spy(sequence):
        flow = original(sequence)
        device = sum(use.count * d for use, _, _, d, _ in sequence)
        host = sum(use.count * h for use, _, h, _, _ in sequence)
        seen.append((flow, max(device, host)))
        return flow
    try:
        stage._flow_forward = spy
        validate._predict(row)
    finally:
        stage._flow_forward = original
    synced = [(flow, bound) for flow, bound in seen if flow is not None]
    assert synced and all(flow >= bound for flow, bound in synced)
