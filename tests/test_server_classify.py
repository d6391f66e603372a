"""`hub-vit classify` and the Python clients against the real tritonserver serving the default model.

Lists longer than the model's max_batch_size, bad files among good ones, `--top` bounds, PIL modes Pillow cannot
write as PNG as they are, and directories given as images. One server (module-scoped, default serving options, so
max_batch_size 16 and top-k 5 as `hub-vit serve` runs them), loopback only, free ports, always stopped.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc  # noqa: F401  (the `serve` extra is in `.[all]`: missing is a failure, not a skip)
from PIL import Image
from tritonclient.utils import InferenceServerException
from typer.testing import CliRunner

from hub_vit.resolve import resolve_model
from hub_vit.server.client.classifier import AsyncClassifier, Classifier
from hub_vit.server.client.images import encode
from hub_vit.server.client.messages import Prediction
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import write_repository
from hub_vit.server.runtime.launcher import TritonServer
from tests.programs import HUB_VIT
from tests.served import quiet_statistics, start_server

pytestmark = [pytest.mark.triton, pytest.mark.slow]
PROTOCOLS = ("http", "grpc")
OPTIONS = ServingOptions()  # the defaults `hub-vit serve` uses
IMAGES = 2 * OPTIONS.max_batch_size + 3  # three requests: 16 + 16 + 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = write_repository(resolve_model(None), tmp_path_factory.mktemp("repo") / "repository", OPTIONS)
    with start_server(repo) as server:
        yield server


@pytest.fixture(scope="module")
def digits() -> list[bytes]:
    """Distinct real images (the digits validation split), PNG-encoded, more than two requests' worth."""
    from hub_vit.train.digits import load_digits_split

    images, _ = load_digits_split("val")
    assert len(images) >= IMAGES
    return [_png(Image.fromarray(image)) for image in images[:IMAGES]]


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _url(server: TritonServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _same(a: list[Prediction], b: list[Prediction]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.class_ids == y.class_ids
        np.testing.assert_allclose(x.scores, y.scores, atol=1e-5)


def _requests_counted(client: Classifier, before: int, expected: int, timeout_s: float = 5.0,
                      model: str = "vit") -> int:
    """Requests `model` (the ensemble by default) answered since `before`, read until `expected` is reached or
    `timeout_s` passes (Triton counts a request just after answering it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = client.statistics()[model]["success"] - before
        if done >= expected or time.monotonic() >= deadline:
            return done
        time.sleep(0.02)


# -- 1. lists longer than max_batch_size ----------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_long_lists_are_sent_in_max_batch_size_requests_in_order(server, digits, protocol):
    url = _url(server, protocol)
    with Classifier(url, protocol=protocol) as client:
        one_by_one = [client.classify(image)[0] for image in digits]
        before = quiet_statistics(client)["vit"]["success"]  # the last one-by-one request may still be counting
        served = client.classify(digits)  # was: "[400] inference request batch-size must be <= 16 for 'vit'"
        assert _requests_counted(client, before, 3) == 3  # 16 + 16 + 3, not one request per image
        assert client.max_batch_size() == OPTIONS.max_batch_size
        assert client._config is not None and client._config.max_batch_size == OPTIONS.max_batch_size  # cached
    _same(served, one_by_one)
    assert len({tuple(p.class_ids) for p in served}) > 1  # distinct images: a shuffled order would show

    async def run() -> list[Prediction]:
        async with AsyncClassifier(url, protocol=protocol) as client:
            predictions = await client.classify(digits)
            assert await client.max_batch_size() == OPTIONS.max_batch_size
            return predictions

    _same(asyncio.run(run()), one_by_one)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_image_in_a_later_request_is_named_by_its_index_in_the_list(server, digits, protocol):
    images = list(digits)
    images[20] = b"this is not an image"  # the 5th image of the second request
    with Classifier(_url(server, protocol), protocol=protocol) as client:
        with pytest.raises(InferenceServerException) as info:
            client.classify(images)
    assert "image 20: not an image" in info.value.message(), info.value
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")

    async def run() -> None:
        async with AsyncClassifier(_url(server, protocol), protocol=protocol) as client:
            await client.classify(images)

    with pytest.raises(InferenceServerException, match="image 20: not an image"):
        asyncio.run(run())


# -- 2 and 3. the command line --------------------------------------------------------------------------------------
def _app():
    from hub_vit.cli import _load_commands, app

    _load_commands()
    return app


def _cli(*args: str):
    return CliRunner().invoke(_app(), ["classify", *args])


def test_cli_classifies_every_good_file_and_names_each_bad_one(server, digits, tmp_path):
    files = []
    for index, payload in enumerate(digits[:18]):  # 18 files: two requests
        path = tmp_path / f"digit{index:02d}.png"
        path.write_bytes(payload)
        files.append(path)
    (tmp_path / "bad.jpg").write_bytes(b"this is not an image")
    (tmp_path / "cut.png").write_bytes(digits[0][: len(digits[0]) // 2])  # a truncated PNG
    files.insert(1, tmp_path / "bad.jpg")
    files.insert(17, tmp_path / "cut.png")  # in the second request
    for protocol_args in ((), ("--grpc",)):
        url = server.grpc_url if protocol_args else server.http_url
        with Classifier(server.http_url) as stats:
            before = quiet_statistics(stats)  # the previous requests' steps may be counted a moment after their answers
            result = _cli("--url", url, *protocol_args, "--top", "1", *map(str, files))
            # each request refused at its bad file (named by index) is sent again without it: 2 answered...
            assert _requests_counted(stats, before["vit"]["success"], 2) == 2
            # ... of 4 sent in all (the classifier step sees every request, the refused ones too), not one more
            # request per file of each refused request (that was 2 refused + 18 + 2)
            _requests_counted(stats, before["vit_classifier"]["success"], 4, model="vit_classifier")
            after = quiet_statistics(stats)
            assert after["vit_classifier"]["success"] - before["vit_classifier"]["success"] == 4
        output = " ".join(result.output.split())
        assert result.exit_code == 1, output
        for index in range(18):  # every good file is in the table
            assert f"digit{index:02d}.png" in output, output
        assert f"{tmp_path / 'bad.jpg'}: not an image" in output, output
        assert f"{tmp_path / 'cut.png'}: cannot decode PNG image" in output, output
        assert "image 0" not in output and "ensemble" not in output, output  # a position in a request means nothing
        assert "batch-size" not in output, output


def test_cli_names_images_of_other_formats_left_out_of_a_folder_or_refused(server, digits, tmp_path):
    # a folder's GIF and HEIC files were passed over in silence (7 rows for 9 photos); a GIF given by name was "not an
    # image: 35 bytes starting b'GIF87a...'", though `hub-vit rollout` named it a GIF
    (tmp_path / "photos" / "phone").mkdir(parents=True)
    (tmp_path / "photos" / "x.png").write_bytes(digits[0])
    gif = tmp_path / "photos" / "y.gif"
    Image.new("RGB", (8, 8)).save(gif, "GIF")
    (tmp_path / "photos" / "phone" / "IMG_0001.HEIC").write_bytes(b"\x00\x00\x00\x18ftypheic")
    result = _cli("--url", server.http_url, "--top", "1", str(tmp_path / "photos"), str(gif))
    output = " ".join(result.output.split())
    assert result.exit_code == 1, output
    assert (f"note: left out 2 HEIC / GIF images: {tmp_path / 'photos' / 'phone' / 'IMG_0001.HEIC'}, {gif}; convert "
            "them to JPEG, PNG or WebP to include them") in output, output  # in the folder's sorted order
    assert "x.png" in output, output
    assert (f"{gif}: a GIF image, not one of the supported formats: JPEG, PNG or WebP (convert it to one of them)"
            in output), output


def test_cli_json_is_one_object_per_file_in_the_order_given(server, digits, tmp_path):
    import json

    files = []
    for index, payload in enumerate(digits[:18]):  # two requests
        files.append(tmp_path / f"digit{index:02d}.png")
        files[-1].write_bytes(payload)
    (tmp_path / "bad.jpg").write_bytes(b"this is not an image")
    files.insert(1, tmp_path / "bad.jpg")
    runs = {concurrency: CliRunner().invoke(_app(), ["classify", "--url", server.http_url, "--json", "--top", "2",
                                                     "--concurrency", concurrency, *map(str, files)])
            for concurrency in ("1", "3")}
    assert runs["1"].exit_code == 1 and runs["3"].exit_code == 1, runs["1"].output  # a file failed
    assert runs["1"].stdout == runs["3"].stdout  # requests in flight at once answer as one after another
    result = runs["3"]
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # nothing but JSON on stdout
    assert [line["file"] for line in lines] == [str(path) for path in files]
    assert lines[1] == {"file": str(files[1]), "error": lines[1]["error"]} and "not an image" in lines[1]["error"]
    with Classifier(server.http_url) as client:
        expected = client.classify([path for path in files if path.name != "bad.jpg"])
    for line, prediction in zip([line for line in lines if "error" not in line], expected, strict=True):
        assert line == {"file": line["file"], "labels": prediction.labels[:2], "scores": prediction.scores[:2],
                        "class_ids": prediction.class_ids[:2], "domain": prediction.domain,
                        "domain_score": prediction.domain_score}, line


def test_cli_json_of_a_file_name_that_is_not_utf8_is_valid_json_that_gives_the_name_back(server, digits, tmp_path):
    # was: the name's byte written raw (invalid UTF-8: jq refused the line), or under a strict locale (en_US.UTF-8) a
    # UnicodeEncodeError; the table's row was the same error
    import json

    name = tmp_path / os.fsdecode(b"caf\xe9.png")  # a latin-1 name from an old zip, as Python holds it
    name.write_bytes(digits[0])
    for args, encoding in ((["--json"], "utf-8:strict"), (["--json"], "utf-8:surrogateescape"), ([], "utf-8:strict")):
        result = subprocess.run([*HUB_VIT, "classify", "--url", server.http_url, *args, str(name)], capture_output=True,
                                timeout=120, env={**os.environ, "PYTHONIOENCODING": encoding})
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        text = result.stdout.decode("utf-8")  # valid UTF-8 whatever the locale
        if args:
            assert json.loads(text)["file"] == str(name), text
        else:
            assert "caf\\udce9.png" in text, text


def test_cli_json_into_a_closed_pipe_stops_sending_and_ends_quietly(server, digits, tmp_path):
    # `hub-vit classify --json photos/ | head -1`: each worker thread died with a BrokenPipeError traceback, the other
    # went on sending; then the closed pipe was reported as "no HTTP answer from ...: is a server running there"
    files = []
    for index, payload in enumerate(digits[:IMAGES]):  # three requests
        files.append(tmp_path / f"digit{index:02d}.png")
        files[-1].write_bytes(payload)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write fails with EPIPE
    with Classifier(server.http_url) as stats:
        before = quiet_statistics(stats)
        with os.fdopen(write_end, "wb") as stdout:
            result = subprocess.run([*HUB_VIT, "classify", "--url", server.http_url, "--json", "--concurrency", "1",
                                     *map(str, files)], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
        assert result.returncode == 1 and result.stderr == "", result.stderr  # click's exit for a closed pipe
        assert _requests_counted(stats, before["vit"]["success"], 3, timeout_s=1.0) == 1  # the first request only


def test_cli_top_is_validated_and_capped_with_a_note(server, digits, tmp_path):
    image = tmp_path / "digit.png"
    image.write_bytes(digits[0])
    for bad in ("0", "-1"):
        result = _cli("--url", server.http_url, "--top", bad, str(image))
        assert result.exit_code == 2, result.output
        assert "--top must be at least 1" in result.output and f"got {bad}" in result.output, result.output
    result = _cli("--url", server.http_url, "--top", "10", str(image), str(image))
    output = " ".join(result.output.split())
    assert result.exit_code == 0, output
    assert output.count(f"the server returns {OPTIONS.top_k} labels per image (hub-vit serve --top-k)") == 1, output
    assert f" {OPTIONS.top_k} " in output and f" {OPTIONS.top_k + 1} " not in output, output
    result = _cli("--url", server.http_url, "--top", "2", str(image))
    assert result.exit_code == 0 and "labels per image" not in result.output, result.output
    ranks = [line.split("│")[2].strip() for line in result.output.splitlines() if line.count("│") == 6]
    assert ranks == ["1", "2"], result.output


def test_cli_tells_files_with_the_same_name_apart(server, digits, tmp_path):
    # the table showed the base name only: two x.png rows nobody could tell apart
    for folder, payload in (("a", digits[0]), ("b", digits[1])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.png").write_bytes(payload)
    (tmp_path / "three.png").symlink_to(tmp_path / "a" / "x.png")  # e.g. an HF snapshot's link to a hashed blob
    result = _cli("--url", server.http_url, "--top", "1", str(tmp_path / "a" / "x.png"), str(tmp_path / "b" / "x.png"),
                  str(tmp_path / "three.png"))
    names = [line.split("│")[1].strip() for line in result.output.splitlines() if line.count("│") == 6]
    assert result.exit_code == 0 and names == ["a/x.png", "b/x.png", "three.png"], result.output


# -- 4. 16-bit PIL modes Pillow cannot write as PNG -----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["I;16L", "I;16N"])
def test_16bit_little_endian_modes_are_encoded_with_their_values(server, mode):
    samples = (np.arange(32 * 32, dtype=np.uint32).reshape(32, 32) * 61 % 65536).astype("<u2")
    image = Image.frombytes(mode, (32, 32), samples.tobytes())  # raised "cannot write mode I;16L as PNG"
    decoded = Image.open(io.BytesIO(encode(image)))
    assert decoded.mode == "I;16"
    np.testing.assert_array_equal(np.asarray(decoded), samples)
    reference = Image.frombytes("I;16", (32, 32), samples.tobytes())
    with Classifier(server.http_url) as client:
        _same(client.classify([image]), client.classify([reference]))


# -- 5. a directory given as an image -------------------------------------------------------------------------------
def test_a_directory_is_named_as_one(server, tmp_path: Path):
    with Classifier(server.http_url) as client:
        with pytest.raises(ValueError, match="is a directory; give image files") as info:
            client.classify(str(tmp_path))
        assert "does not exist" not in str(info.value)
        with pytest.raises(ValueError, match="does not exist"):
            client.classify(tmp_path / "missing.png")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_one_classifier_serves_many_threads(server, digits, protocol):
    # was: a Classifier made in one thread and called from others (a web app's request handlers) hung forever over
    # HTTP: tritonclient's HTTP client belongs to the thread that made it
    import threading

    with Classifier(_url(server, protocol), protocol=protocol) as client:
        expected = client.classify(digits[:4])
        answers: dict[int, list[Prediction]] = {}

        def work(index: int) -> None:
            for _ in range(5):
                answers[index] = client.classify(digits[:4])

        threads = [threading.Thread(target=work, args=(index,), daemon=True) for index in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads), "a thread's request never came back"
        assert sorted(answers) == [0, 1, 2, 3]
        for got in answers.values():
            _same(got, expected)
        # each ended thread's client and gevent loop are released (a thread per request: the test below)


def test_a_thread_per_request_leaves_no_descriptors_behind(server, digits):
    # was: each calling thread's gevent loop outlived it (4 descriptors a thread, freed by nothing, close() included):
    # a threaded web server (a thread per request) ran out of descriptors at `ulimit -n 1024` after ~250 requests
    import threading

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    with Classifier(server.http_url) as client:
        expected = client.classify(digits[:1])
        before = descriptors()
        answers: list[list[Prediction]] = []
        for _ in range(60):
            thread = threading.Thread(target=lambda: answers.append(client.classify(digits[:1])))
            thread.start()
            thread.join(60)
            _same(answers.pop(), expected)
        assert descriptors() - before < 20, descriptors() - before  # was 240: each new thread frees the ended ones'
    assert descriptors() - before < 10, descriptors() - before  # and close() the last one's


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_forked_process_makes_its_own_connections(server, digits, protocol):
    # was: a child forked after its parent's first request (multiprocessing's fork, gunicorn --preload) used the
    # parent's connection: over HTTP both read answers off one socket, and 7 of 50 labels were the other process's
    # image's, the parent's too; over gRPC some of the child's calls failed (the channel does not cross a fork)
    def answer(client: Classifier, image: bytes) -> tuple:
        prediction = client.classify([image])[0]
        return tuple(prediction.class_ids), round(prediction.scores[0], 4)

    with Classifier(_url(server, protocol), protocol=protocol) as client:
        expected = [answer(client, digits[index]) for index in range(3)]
        assert len(set(expected)) == 3  # three images the answers tell apart
        children = {}
        for index in (1, 2):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: only os._exit leaves it (no pytest teardown in a forked copy)
                try:
                    wrong = sum(answer(client, digits[index]) != expected[index] for _ in range(30))
                    os.write(write, f"{wrong} wrong".encode())
                except BaseException as err:  # noqa: BLE001 (reported to the parent, which fails the test)
                    os.write(write, repr(err).encode()[:500])
                finally:
                    os._exit(0)
            os.close(write)
            children[pid] = read
        parent_wrong = sum(answer(client, digits[0]) != expected[0] for _ in range(30))
        reports, deadline = [], time.monotonic() + 60
        for pid, read in children.items():
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    pytest.fail("a forked child's request never came back")
                time.sleep(0.05)
            with os.fdopen(read, "rb") as pipe:
                reports.append(pipe.read().decode())
        assert reports == ["0 wrong", "0 wrong"] and parent_wrong == 0, (reports, parent_wrong)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_async_classifier_made_outside_a_coroutine_works_in_each_event_loop(server, digits, protocol):
    # was: made outside a running event loop (a web app's module-level client), HTTP's raised "no running event loop"
    # and every gRPC call failed with "attached to a different loop"; a second asyncio.run failed alike
    with Classifier(_url(server, protocol), protocol=protocol) as reference:
        expected = reference.classify(digits[:3])
    client = AsyncClassifier(_url(server, protocol), protocol=protocol)

    async def run() -> list[Prediction]:
        async with client:
            return await client.classify(digits[:3])

    for _ in range(2):  # two event loops, one after the other
        _same(asyncio.run(run()), expected)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_async_classifier_closes_the_clients_of_event_loops_that_ended(server, digits, protocol, caplog):
    # was: used in one asyncio.run without closing it, then in another, its first HTTP client was left to the garbage
    # collector: aiohttp logged "Unclosed client session" and "Unclosed connector" on stderr, once per loop, even after
    # close(). (The sockets of a loop that has ended are closed when collected: asyncio's ResourceWarning, silent by
    # default, is not checked here.)
    import gc
    import warnings

    client = AsyncClassifier(_url(server, protocol), protocol=protocol)

    async def run() -> list[Prediction]:
        return await client.classify(digits[:1])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = asyncio.run(run())
        _same(asyncio.run(run()), first)  # the first loop's client is closed here

        async def close() -> None:
            await client.close()
        asyncio.run(close())  # the second loop's, from a third loop
        gc.collect()
    unclosed = [str(warning.message) for warning in caught if "session" in str(warning.message)
                or "connector" in str(warning.message)] + [record.getMessage() for record in caplog.records]
    assert not unclosed, unclosed


def test_a_grpc_url_speaks_grpc_without_being_told(server, digits, tmp_path):
    # `hub-vit serve` prints the gRPC endpoint as host:port; users paste it as grpc://host:port, which was spoken to
    # over HTTP and failed with "('Expected HTTP/, RTSP/ or ICE/', 8)" and a hint that the port was wrong
    url = f"grpc://{server.grpc_url}"
    with Classifier(server.grpc_url, protocol="grpc") as reference:
        expected = reference.classify(digits[:3])
    with Classifier(url) as client:
        assert client.protocol == "grpc"
        _same(client.classify(digits[:3]), expected)

    async def run() -> list[Prediction]:
        async with AsyncClassifier(url) as client:
            return await client.classify(digits[:3])

    _same(asyncio.run(run()), expected)
    image = tmp_path / "digit.png"
    image.write_bytes(digits[0])
    result = _cli("--url", url, str(image))
    assert result.exit_code == 0 and "(grpc)" in result.output, result.output
    from hub_vit.cli import app

    result = CliRunner().invoke(app, ["loadtest", "--url", url, "--requests", "4", str(image)])
    assert result.exit_code == 0 and "grpc" in result.output, result.output


def test_loadtest_takes_a_folder_as_classify_does(server, digits, tmp_path):
    """`hub-vit loadtest photos/` was refused ("is a directory") although classify and rollout take folders: it now
    cycles through the folder's JPEG, PNG and WebP files (a damaged one among them counts as failed requests: the
    folder's files are what is sent) and names the images of other formats it leaves out."""
    from hub_vit.cli import _load_commands, app

    _load_commands()
    photos = tmp_path / "photos"
    (photos / "more").mkdir(parents=True)
    (photos / "digit.png").write_bytes(digits[0])
    (photos / "more" / "damaged.png").write_bytes(b"not an image at all")
    (photos / "phone.heic").write_bytes(b"\x00\x00\x00\x18ftypheic")
    out = tmp_path / "load.json"
    result = CliRunner().invoke(app, ["loadtest", "--url", _url(server, "http"), "--requests", "6",
                                      "--concurrency", "1", "--allow-errors", "--json", str(out), str(photos)])
    output = " ".join(result.output.split())
    assert result.exit_code == 0, output
    assert f"note: left out 1 HEIC image: {photos / 'phone.heic'}; convert it to JPEG, PNG or WebP" in output
    report = json.loads(out.read_text())
    assert report["requests"] > 0 and report["errors"] > 0, report  # both of the folder's files were sent


def test_loadtest_whose_duration_ends_before_its_first_request_fails_saying_so(server, digits, tmp_path):
    """It used to report '0 requests ... 0.0 req/s', exit 0, and warn that the load generator was the limit."""
    from hub_vit.cli import _load_commands, app

    _load_commands()  # the commands register lazily: this test must not depend on an earlier one
    image = tmp_path / "digit.png"
    image.write_bytes(digits[0])
    result = CliRunner().invoke(app, ["loadtest", "--url", _url(server, "http"), "--duration", "1e-9", str(image)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1, output
    assert "no request was sent: the --duration of 1e-09 s ended before the first one; give a longer --duration" \
        in output
    assert "may be its limit" not in output and "batching" not in output  # no numbers of a run that sent nothing


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_cli_ctrl_c_shows_what_was_answered_and_says_it_was_interrupted(server, digits, tmp_path, monkeypatch,
                                                                         as_json):
    # was: exit 130 with nothing on stdout or stderr: the table of the answers already received was thrown away
    import _thread

    from hub_vit.server.client import classifier

    files = []
    for index, payload in enumerate(digits[:IMAGES]):  # three requests: 16 + 16 + 3
        files.append(tmp_path / f"digit{index:02d}.png")
        files[-1].write_bytes(payload)
    calls = []

    class Interrupted(Classifier):
        def classify(self, *args, **kwargs):  # the second request: Ctrl-C while it is in flight
            calls.append(len(calls))
            if len(calls) == 2:
                _thread.interrupt_main()
                time.sleep(2.0)
            return super().classify(*args, **kwargs)

    monkeypatch.setattr(classifier, "Classifier", Interrupted)
    result = _cli("--url", server.http_url, "--top", "1", "--concurrency", "1", *(["--json"] if as_json else []),
                  *map(str, files))
    assert result.exit_code == 130, result.output
    assert len(calls) == 2  # no request after the Ctrl-C
    stderr = " ".join(result.stderr.split())
    assert (f"interrupted (Ctrl-C): 16 of {IMAGES} files classified, {IMAGES - 16} not (the first: {files[16]}); the "
            "answers above stand") in stderr, stderr
    if as_json:
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert [line["file"] for line in lines] == [str(path) for path in files]  # every file has its line
        assert all("labels" in line for line in lines[:16]) and all(
            line.get("error") == "not classified: interrupted (Ctrl-C)" for line in lines[16:]), lines
    else:
        assert all(path.name in result.stdout for path in files[:16]), result.stdout
        assert files[16].name not in result.stdout, result.stdout


def test_cli_ctrl_c_with_requests_in_flight_ends_with_130_every_time(server, digits, tmp_path):
    # was: a real Ctrl-C with requests in flight over HTTP ended in a SIGSEGV in 4 of 10 runs (no "interrupted" line,
    # part of the JSON lines missing): closing the client destroyed the gevent hubs of the workers the signal stopped
    import signal

    folder = tmp_path / "digits"
    folder.mkdir()
    for index in range(25 * 16):  # 25 requests of 16 files: most are still to come at the first answer
        (folder / f"{index:03d}.png").write_bytes(digits[index % len(digits)])
    for run in range(8):  # the crash came in about 1 run in 4
        process = subprocess.Popen([*HUB_VIT, "classify", "--url", server.http_url, "--json", str(folder)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert process.stdout is not None
        first = process.stdout.readline()  # the first request's files are answered: the others are on their way
        time.sleep(0.02 * (run % 4))
        process.send_signal(signal.SIGINT)
        rest = process.stdout.read()  # from the reader's buffer too (communicate would skip what readline buffered)
        stderr = process.communicate(timeout=60)[1]
        lines = [json.loads(line) for line in (first + rest).splitlines()]
        assert process.returncode == 130, (run, process.returncode, stderr)
        assert "interrupted (Ctrl-C):" in stderr, (run, stderr)
        assert len(lines) == 25 * 16, (run, len(lines))  # every file has its line, the unsent ones with the reason


def test_cli_ctrl_c_while_the_table_is_drawn_says_so(server, digits, tmp_path, monkeypatch):
    # was: exit 130 and nothing at all: rich draws the whole table before printing it (1.7 s for 1,800 files)
    from hub_vit.cli import classify as command

    image = tmp_path / "digit.png"
    image.write_bytes(digits[0])

    def drawing(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "_print_table", drawing)
    result = _cli("--url", server.http_url, str(image))
    assert result.exit_code == 130, result.output
    assert "interrupted (Ctrl-C) while the answers were shown: 1 of 1 files were classified" in \
        " ".join(result.stderr.split()), result.stderr
