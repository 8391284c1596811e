"""Notices and log lines that come in floods are limited in rate, each address on its own."""

from __future__ import annotations

from exo_tui.rate import NoticeRate, RatePerKey


def test_one_notice_per_interval_and_the_next_says_how_many_were_held_back() -> None:
    now = [100.0]
    rate = NoticeRate(10.0, clock=lambda: now[0])
    assert rate.allow() == 0
    allowed = []
    for _ in range(299):
        now[0] += 0.01
        allowed.append(rate.allow())
    assert allowed == [None] * 299
    now[0] += 10.0
    assert rate.allow() == 299
    assert rate.allow() is None


def test_each_address_has_its_own_rate_and_only_the_latest_are_remembered() -> None:
    now = [0.0]
    rate = RatePerKey(10.0, keys=2, clock=lambda: now[0])
    assert (rate.allow("10.0.0.1"), rate.allow("10.0.0.1"), rate.allow("10.0.0.2")) == (0, None, 0)
    rate.allow("10.0.0.3")  # 10.0.0.1 is forgotten: it is allowed again at once
    assert rate.allow("10.0.0.1") == 0
    assert rate.allow("10.0.0.3") is None
