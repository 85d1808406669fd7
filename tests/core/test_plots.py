"""bench.plots: charts from synthetic benchmark results (no server). Reading results
into charts needs no matplotlib; drawing them is tested where it is installed."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from bench import plots, stats


def header(command: str) -> dict[str, Any]:
    return {"command": command, "utc": "20261124T054231Z",
            "machine": {"nproc": 2, "cpu_model": "AMD EPYC", "python": "3.11.7",
                        "loadavg_at_start": [0.86, 0.7, 0.6]},
            "code": {"commit": "abc1234", "uncommitted_in_gateway_router_store": []}}


def room_phase(server: str, mode: str, dps: float, p50: float, p99: float, busy: float,
               hist: dict[int, int] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"server": server, "mode": mode, "kind": server, "nodes": 1,
                           "subscribers": 100, "deliveries_per_s": dps,
                           "latency": {"count": 1000, "p50_ms": p50, "p99_ms": p99,
                                       "max_ms": p99 * 1.2},
                           "cpu": {"machine_busy_pct": busy}}
    if hist is not None:
        out["latency_hist"] = {str(k): v for k, v in hist.items()}
    return out


def bucket(ms: float) -> int:
    """``bench.stats``' bucket of a latency."""
    return stats.bucket(ms / 1000)


def room_result(hist: bool = False) -> dict[str, Any]:
    h = {bucket(5): 500, bucket(8): 400, bucket(20): 99, bucket(40): 1} if hist else None
    return {**header(".venv/bin/python -m bench.room_bench --quick --skip-three"),
            "settings": {"subscribers": 100, "client_procs": 2, "window": 32, "seconds": 3.0,
                         "warmup": 1.0, "rate": 20.0, "paced_seconds": 3.0,
                         "sample_every": 10},
            "phases": [room_phase("ours", "throughput", 700_000.0, 29.4, 99.0, 93.8),
                       room_phase("ours", "paced", 2_000.0, 9.34, 31.2, 73.0, h),
                       room_phase("ws", "throughput", 57_478.7, 550.0, 948.4, 97.7),
                       room_phase("ws", "paced", 2_000.0, 9.16, 24.3, 36.3, h),
                       room_phase("sio", "throughput", 19_586.1, 1619.3, 1929.0, 75.2),
                       {"server": "sio", "mode": "paced", "error": "TimeoutError: slow"}],
            "nodes": [], "logs": []}


def load_phase(acks: float, p50: float, busy: float, target: float | None = None
               ) -> dict[str, Any]:
    lat = {"count": 6000, "p50_ms": p50, "p95_ms": p50 * 2, "p99_ms": p50 * 3,
           "max_ms": p50 * 4}
    out = {"seconds": 10.0, "acks_per_s": acks, "deliveries_per_s": acks,
           "ack_latency": lat, "delivery_latency": {**lat, "p50_ms": p50 * 1.01},
           "cpu": {"machine_busy_pct": busy}}
    return {**out, "target_per_s": target} if target else out


def chat_result() -> dict[str, Any]:
    runs = [{"batch": b, "msgs_per_s": v} for b, v in ((1, 316.4), (16, 1315.8),
                                                        (64, 1732.7), (256, 2158.5))]
    return {**header(".venv/bin/python -m bench.chat_bench --mongo-url "
                     "mongodb://127.0.0.1:27018"),
            "settings": {"pairs": 50, "window": 32, "duration": 10.0, "warmup": 2.0},
            "raw": {"runs": runs, "reference": [], "best_batch": 256,
                    "best_msgs_per_s": 2158.5},
            "saturation": load_phase(1306.1, 1197.7, 95.5),
            "latency": load_phase(652.9, 47.7, 95.3, target=653.0), "ratio": 0.605}


def write(tmp_path: Path, name: str, obj: Any) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def test_room_result_gives_fanout_and_paced_latency_charts(tmp_path: Path) -> None:
    charts = plots.charts([write(tmp_path, "room.json", room_result())])
    assert set(charts) == {"room-fanout.svg", "room-paced-latency.svg"}

    fan = charts["room-fanout.svg"]
    assert fan.kind == "hbar" and fan.title == "Room fan-out: deliveries/s, one node, one room"
    assert {b.label: b.value for b in fan.bars} == {
        "imgate (ours)": 700_000.0, "websockets broadcast()": 57_478.7,
        "python-socketio": 19_586.1}
    assert [plots.fmt_num(b.value) for b in fan.bars] == ["700k", "57.5k", "19.6k"]
    assert fan.bars[0].note == "12.2x ws, 35.7x sio"  # ratios beside our bar
    for part in ("bench.room_bench --quick", "abc1234", "2026-11-24 05:42 UTC",
                 "ours 93.8%", "sio 75.2%"):
        assert part in fan.footer

    paced = charts["room-paced-latency.svg"]
    assert paced.kind == "grouped"
    assert paced.groups == ["imgate (ours)", "websockets broadcast()"]
    assert [name for name, _ in paced.legend] == ["p50", "p99"]
    assert paced.values == [[9.34, 31.2], [9.16, 24.3]]
    assert "Failed, not shown: sio (TimeoutError: slow)" in paced.subtitle


def test_room_histograms_give_a_percentile_chart(tmp_path: Path) -> None:
    charts = plots.charts([write(tmp_path, "room.json", room_result(hist=True))])
    chart = charts["room-latency-paced.svg"]
    assert chart.kind == "percentile" and "room-latency-throughput.svg" not in charts
    assert [s.name for s in chart.series] == ["imgate (ours)", "websockets broadcast()"]
    ys = [y for _, y in chart.series[0].points]
    assert ys == sorted(ys)  # latency never falls as the percentile rises


def test_hist_series_percentiles() -> None:
    s = plots.hist_series("x", "#000", {bucket(5): 90, bucket(50): 10}, max_ms=51.0)
    by_x = dict(s.points)
    assert by_x[0.0] == pytest.approx(5, rel=0.01)  # p0
    assert s.points[-1][1] == pytest.approx(50, rel=0.01)  # p99 (rank 99 of 100)
    assert s.max_ms == 51.0 and s.max_x == pytest.approx(2.0)


def test_chat_result_gives_throughput_and_latency_charts(tmp_path: Path) -> None:
    charts = plots.charts([write(tmp_path, "chat.json", chat_result())])
    assert set(charts) == {"chat-throughput.svg", "chat-latency.svg"}
    thr = charts["chat-throughput.svg"]
    assert {b.label: b.value for b in thr.bars} == {
        "store raw, B=1": 316.4, "store raw, B=16": 1315.8, "store raw, B=64": 1732.7,
        "store raw, B=256": 2158.5, "imgate node": 1306.1}
    assert thr.bars[-1].note == "0.60x the raw store" and thr.bars[3].note == "best B"

    lat = charts["chat-latency.svg"]
    assert lat.title == "1:1 chat: latency at 653 msgs/s (open loop)"
    assert [s.name for s in lat.series] == ["ack (send -> ack)", "delivery (send -> push)"]
    ack = lat.series[0]
    want = [(plots.nines(p), v) for p, v in ((50, 47.7), (95, 95.4), (99, 143.1))]
    assert [c for pt in ack.points for c in pt] == pytest.approx([c for pt in want for c in pt])
    assert ack.max_ms == pytest.approx(190.8) and ack.max_x == pytest.approx(math.log10(6000))
    assert "50% of saturation" in lat.subtitle


def test_chat_without_raw_phase_still_plots(tmp_path: Path) -> None:
    res = chat_result()
    del res["raw"]
    res["ratio"] = None
    charts = plots.charts([write(tmp_path, "chat.json", res)])
    assert [(b.label, b.value) for b in charts["chat-throughput.svg"].bars] == [
        ("imgate node", 1306.1)]


def test_main_writes_svgs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    room, chat = (write(tmp_path, "r.json", room_result(hist=True)),
                  write(tmp_path, "c.json", chat_result()))
    out = tmp_path / "img"
    assert plots.main(["--out", str(out), str(room), str(chat)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "chat-latency.svg", "chat-throughput.svg", "room-fanout.svg",
        "room-latency-paced.svg", "room-paced-latency.svg"]
    for p in out.iterdir():
        assert p.stat().st_size < 100_000
        root = ET.fromstring(p.read_text())
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        words = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
        assert "Measured:" in words  # text stays text (searchable, small)
    fan = (out / "room-fanout.svg").read_text()
    assert "Room fan-out: deliveries/s" in fan and "12.2x ws, 35.7x sio" in fan
    assert "room-fanout.svg" in capsys.readouterr().out


@pytest.mark.parametrize(("content", "message"), [
    ("not json", "not JSON"),
    ("[1, 2]", "a JSON object was expected, got list"),
    ('{"phases": "x", "foo": 1}', "not a bench.room_bench result"),
    ('{"saturation": {}}', "not a bench.room_bench result"),
])
def test_bad_input_says_what_is_wrong(tmp_path: Path, content: str, message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(plots.PlotError, match=message):
        plots.charts([p])
    assert plots.main(["--out", str(tmp_path / "img"), str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.plots: error: ") and str(p) in err and message in err
    assert not (tmp_path / "img").exists()


def test_missing_fields_and_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(plots.PlotError, match="cannot read"):
        plots.charts([tmp_path / "nope.json"])
    res = chat_result()
    del res["saturation"]["acks_per_s"]
    with pytest.raises(plots.PlotError, match=r"chat.json: saturation: no 'acks_per_s'"):
        plots.charts([write(tmp_path, "chat.json", res)])
    room = room_result()
    room["phases"] = [p for p in room["phases"] if p["mode"] != "throughput"]
    with pytest.raises(plots.PlotError, match="no successful throughput phase"):
        plots.charts([write(tmp_path, "room.json", room)])
    with pytest.raises(plots.PlotError, match="a second room result"):
        plots.charts([write(tmp_path, "a.json", room_result()),
                      write(tmp_path, "b.json", room_result())])


def test_number_formats() -> None:
    assert [plots.fmt_num(v) for v in (6733558, 138395.7, 25088.3, 924.1, 9.58, 0.5, 0)] == [
        "6.73M", "138k", "25.1k", "924", "9.58", "0.5", "0"]
    assert [plots.fmt_ratio(v) for v in (268.4, 12.25, 0.605)] == ["268x", "12.2x", "0.60x"]
    assert [round(plots.nines(p), 6) for p in (50, 90, 99, 99.9)] == [0.30103, 1, 2, 3]
