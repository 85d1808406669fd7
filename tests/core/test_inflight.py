"""core.inflight: the oldest mid that may still land (no servers)."""

from core.inflight import InFlight


def test_the_oldest_send_in_flight_holds_the_mark_until_acked():
    f = InFlight()
    assert f.oldest(0.0) is None
    f.add(10)
    f.add(12)
    assert f.oldest(0.0) == 10
    f.done(10)
    assert f.oldest(0.0) == 12
    f.done(12)
    assert f.oldest(0.0) is None


def test_a_failed_send_lingers_then_is_forgotten():
    f = InFlight(linger_s=30.0)
    f.add(10)
    f.failed(10, now=100.0)  # the store may still write it; the resend reuses it
    f.add(20)
    f.done(20)
    assert f.oldest(129.0) == 10
    assert f.oldest(130.0) is None


def test_two_sends_under_one_mid_and_a_resend_that_lands():
    f = InFlight()
    f.add(10)
    f.add(10)  # a resend of the same cmid while the first is still in flight
    f.done(10)
    assert f.oldest(0.0) is None  # acked: nothing more can land under it
    f.add(11)
    f.failed(11, now=0.0)
    f.add(11)  # the resend, on this node
    f.done(11)
    assert f.oldest(1.0) is None


def test_the_live_mark_leaves_out_failed_and_kept_sends():
    f = InFlight(linger_s=30.0)
    f.add(10)
    f.failed(10, now=100.0)  # lingers
    f.keep(11)  # a failed send the finisher holds until found or given up
    f.add(20)  # under way
    assert f.oldest(101.0) == 10 and f.oldest_live() == 20
    f.done(20)
    assert f.oldest_live() is None and f.oldest(101.0) == 10
    f.done(11)
    f.done(10)  # found stored by the finisher: the linger ends too
    assert f.oldest(101.0) is None
