from rich.console import Console

from modelward.core.progress import NullProgress, ProgressSink, RecordingProgress, RichProgress, as_sink


def test_recording_sink_keeps_events_in_order() -> None:
    rec = RecordingProgress()
    rec.start("a", 3, "work a")
    rec.advance("a", 2, "half")
    rec.advance("a")
    rec.done("a", "ok")
    assert rec.events == [("start", "a", 3, "work a"), ("advance", "a", 2, "half"), ("advance", "a", 1, ""),
                          ("done", "a", None, "ok")]
    assert rec.completed("a") == 3 and rec.keys() == ["a"]


def test_sinks_satisfy_the_protocol() -> None:
    for sink in (NullProgress(), RecordingProgress(), RichProgress(Console(quiet=True))):
        assert isinstance(sink, ProgressSink)
    assert isinstance(as_sink(None), NullProgress)
    rec = RecordingProgress()
    assert as_sink(rec) is rec


def test_rich_sink_tracks_totals_and_tolerates_unstarted_keys() -> None:
    with RichProgress(Console(quiet=True)) as p:
        p.start("runs", 4, "study")
        p.advance("runs", 3, "x")
        p.advance("other", 2)  # never started: created on the fly
        p.done("runs")
        p.done("other")
        tasks = {t.description: t for t in p.progress.tasks}
    assert tasks["study"].completed == 4 and tasks["study"].fields["info"] == "x"
    assert tasks["other"].completed == 2 and tasks["other"].total == 2
