"""Only a page's newest analysis reaches it (`hub_vit/demo/newest.py`), without a browser: runs in threads, as
Gradio's workers run them. The browser tests run the same wrapper under Gradio itself (every analysis there)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import gradio as gr
from gradio.utils import get_type_hints, is_special_typed_parameter

from hub_vit.demo.newest import SessionRuns, newest_only

CONTROLS = ("demo-model", "in-process", "mean", 0.0, None, None)  # the six inputs after the image


def page(session: str | None) -> Any:
    return SimpleNamespace(session_hash=session)  # what the handler reads of Gradio's `gr.Request`


def slow_first(started: threading.Event, release: threading.Event):
    """A handler whose run for `slow.png` waits for `release`, so a later run finishes first."""

    def analyze(image_path: str | None, *controls: object) -> tuple[Any, ...]:
        if image_path == "slow.png":
            started.set()
            assert release.wait(10)
        return f"labels of {image_path}", f"overlay of {image_path}"

    return analyze


def test_a_run_overtaken_by_a_later_one_of_its_page_leaves_the_page_to_it() -> None:
    # was: an upload that finished after the example picked next put its labels and maps beside the example's picture
    started, release = threading.Event(), threading.Event()
    runs = SessionRuns()
    run = newest_only(runs, slow_first(started, release))
    answers: dict[str, tuple[Any, ...]] = {}
    slow = threading.Thread(target=lambda: answers.update(slow=run("slow.png", *CONTROLS, request=page("a"))))
    slow.start()
    assert started.wait(10)
    answers["fast"] = run("fast.png", *CONTROLS, request=page("a"))
    release.set()
    slow.join(10)
    assert answers["fast"] == ("labels of fast.png", "overlay of fast.png")
    assert answers["slow"] == (gr.skip(), gr.skip())  # every output left as the newer run set it


def test_another_pages_run_overtakes_nothing() -> None:
    started, release = threading.Event(), threading.Event()
    run = newest_only(SessionRuns(), slow_first(started, release))
    answers: dict[str, tuple[Any, ...]] = {}
    slow = threading.Thread(target=lambda: answers.update(slow=run("slow.png", *CONTROLS, request=page("a"))))
    slow.start()
    assert started.wait(10)
    assert run("other.png", *CONTROLS, request=page("b")) == ("labels of other.png", "overlay of other.png")
    release.set()
    slow.join(10)
    assert answers["slow"] == ("labels of slow.png", "overlay of slow.png")


def test_runs_one_after_another_each_answer_and_a_closed_page_is_forgotten() -> None:
    runs = SessionRuns()
    run = newest_only(runs, slow_first(threading.Event(), threading.Event()))
    for name in ("one.png", "two.png", None):
        assert run(name, *CONTROLS, request=page("a")) == (f"labels of {name}", f"overlay of {name}")
    assert run("api.png", *CONTROLS, request=page(None)) == ("labels of api.png", "overlay of api.png")
    assert len(runs) == 1  # a call without a session is not tracked
    runs.forget(page("a"))  # `Blocks.unload`
    assert len(runs) == 0


def test_gradio_passes_the_request_and_names_the_event_after_the_handler() -> None:
    def analyze(image_path: str | None, *controls: object) -> tuple[Any, ...]:
        return ()

    run = newest_only(SessionRuns(), analyze)
    assert is_special_typed_parameter("request", get_type_hints(run))
    assert is_special_typed_parameter("request", get_type_hints(SessionRuns().forget))
    assert run.__name__ == "analyze"
