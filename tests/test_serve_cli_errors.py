"""`hub-vit serve` / `repository` / `loadtest`: what a user gets wrong is one clear error naming the option, never a
traceback or a silently ignored option (each case below was reproduced by a review first). No server is started:
every check here happens before one would be."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from hub_vit.catalog import default_model_folder
from hub_vit.cli import _load_commands, app

pytest.importorskip("tritonclient.grpc")


def served_eval(**changes: object) -> dict[str, object]:
    """The served preprocessing's transform settings: Google's evaluation transform (the one data config's
    defaults) with `changes`, as `Preprocess.from_params` receives them from a generated config."""
    from hub_vit.data_config import GOOGLE_EVAL

    return {"interpolation": GOOGLE_EVAL.interpolation, "crop_mode": GOOGLE_EVAL.crop_mode, "mean": GOOGLE_EVAL.mean,
            "std": GOOGLE_EVAL.std, **changes}


def _run(*args: str) -> tuple[int, str]:
    _load_commands()
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


PORTS = ("--http-port", "18401", "--grpc-port", "18402", "--metrics-port", "18403")


@pytest.mark.parametrize("args, message", [
    (("--host", "example.invalid"), "cannot resolve this name"),
    (("--host", "10.9.8.7"), "is not an address of this machine"),
    (("--host", "::1"), "IPv6 addresses are not supported"),
    (("--repository", "/nonexistent/repo"), "--repository '/nonexistent/repo' is missing"),
    (("--exit-timeout", "-1"), "--exit-timeout must be from 0 to 2147483647 seconds, got -1"),
    (("--max-queue-delay-us", "-1"), "--max-queue-delay-us must be 0 or a positive number of microseconds"),
    # was taken: a lone request then waited in the queue until the client timed out, told to check the port
    (("--max-queue-delay-us", "1000000000000"), "--max-queue-delay-us must be at most 10000000 (10 s; a request "
                                                "alone waits the whole delay), got 1000000000000; it is in "
                                                "microseconds"),
    (("--top-k", "0"), "error: --top-k must be a positive integer, got 0"),  # the flag, not the Python field
    (("--queue-timeout-us", "-5"), "--queue-timeout-us must be 0 or a positive number of microseconds"),
    (("--queue-timeout-us", "90000000000"), "--queue-timeout-us must be at most 86400000000 (one day)"),
    # protobuf said only "Value out of range: 5000000000", naming no option
    (("--max-queue-size", "5000000000"), "--max-queue-size must be at most 4294967295 (Triton's config holds it as a "
                                         "uint32), got 5000000000"),
    # was written: 1000 processes, each loading the model, at start
    (("--instances", "1000"), "--instances must be at most 128 (each instance is a process of its own, with its own "
                              "copy of the model), got 1000"),
    # was written: a warm-up of a million images at start
    (("--max-batch-size", "1000000"), "--max-batch-size must be at most 4096 (each instance warms up with one batch "
                                      "of this size when the server starts), got 1000000"),
    # the valid range, not "a positive integer" alone
    (("--instances", "0"), "--instances must be an integer from 1 to 128, got 0"),
    (("--max-batch-size", "0"), "--max-batch-size must be an integer from 1 to 4096, got 0"),
    (("--demo-port", "7931"), "--demo-port only applies with --demo (serve starts no demo without it)"),
    (("--demo-root-path", "/vit"), "--demo-root-path only applies with --demo (serve starts no demo without it)"),
    (("--demo", "--demo-root-path", "vit"), "--demo-root-path 'vit' is not a URL path such as /vit"),
    # the model name is part of the stub's model path, which it reads as ASCII: a load failure before
    (("--name", "vït"), "--name 'vït' (the model clients call) may only use ASCII letters, digits, '_' and '-'"),
    # the user's own value is not rewritten ('has --top-k here' before)
    (("--name", "has top_k here"), "--name 'has top_k here' (the model clients call) may only use"),
    (("--max-request-mb", "0"), "--max-request-mb must be a positive integer, got 0"),
    # was: a traceback from grpc (OverflowError) after the build; and Triton's 40-line usage text, exit 1
    (("--max-request-mb", "2048"), "--max-request-mb must be from 1 to 2047 (Triton's gRPC server takes messages up to "
                                   "2 GiB), got 2048"),
    (("--exit-timeout", "2147483648"), "--exit-timeout must be from 0 to 2147483647 seconds, got 2147483648"),
    (("--max-connections", "-3"), "--max-connections must be a positive integer, got -3"),
    (("--front-processes", "0"), "--front-processes must be between 1 and 64, got 0"),
    (("--front-processes", "65"), "--front-processes must be between 1 and 64, got 65"),
    # Triton applies both through the queue policy: without it they would be dropped without a word
    (("--no-queue-policy", "--max-queue-size", "8"), "--max-queue-size is applied by Triton's queue policy, which "
                                                     "--no-queue-policy leaves out: give one or the other"),
    (("--no-queue-policy", "--max-queue-size", "8", "--queue-timeout-us", "9"),
     "--max-queue-size and --queue-timeout-us are applied by Triton's queue policy"),
])
def test_serve_refuses_bad_settings_before_starting(args, message):
    code, out = _run("serve", *PORTS, *args)
    assert code == 2 and message in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize("command, flavour", [("repository", "gpu"), ("repository", "torch"), ("serve", "torch")])
def test_a_cpu_variant_for_a_flavour_without_one_is_refused(tmp_path, command, flavour):
    # `--flavour gpu --cpu-variant fp32` was accepted and recorded in the manifest of a repository that has no CPU graph
    out_args = (str(tmp_path / "repo"),) if command == "repository" else PORTS
    code, out = _run(command, *out_args, "--flavour", flavour, "--cpu-variant", "fp32")
    assert code == 2 and f"--cpu-variant chooses the CPU flavour's ONNX graph; the {flavour} flavour" in out, out
    assert "pass --flavour cpu, or leave --cpu-variant out" in out and not (tmp_path / "repo").exists()


def test_serve_repository_refuses_options_it_would_ignore(tmp_path):
    (tmp_path / "repo").mkdir()
    code, out = _run("serve", *PORTS, "--repository", str(tmp_path / "repo"), "--top-k", "2", "--max-batch-size", "4")
    assert code == 2 and "--max-batch-size, --top-k only apply when serve builds the repository" in out, out
    code, out = _run("serve", *PORTS, "--repository", str(tmp_path / "repo"), "--no-queue-policy")
    assert code == 2 and "--queue-policy only applies when serve builds the repository" in out, out
    code, out = _run("serve", *PORTS, "--repository", str(tmp_path / "repo"), "simplevit_digits")
    assert code == 2 and "MODEL only applies when" in out


def test_serve_repository_names_a_gpu_repository(tmp_path):
    code, out = _run("repository", str(tmp_path / "gpu"), "--flavour", "gpu")
    assert code == 0, out
    code, out = _run("serve", *PORTS, "--repository", str(tmp_path / "gpu"))
    assert code == 2 and "is a GPU-flavour repository" in out and "--flavour cpu" in out


def test_corrupt_onnx_is_named_not_a_traceback(tmp_path):
    bad = tmp_path / "trunc.onnx"
    bad.write_bytes(b"\x08\x07\x12\x04this is not a protobuf" * 50)
    code, out = _run("repository", str(tmp_path / "repo"), "--model", str(bad))
    assert code == 2 and "is not a valid ONNX model (truncated or corrupt?)" in out, out
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("model, message", [
    ("simplevit_ti16", "has no published weights to serve"),
    ("simplevit_digits.foo", "no pretrained tag 'foo'; valid tags: sklearn_digits"),
])
def test_registered_names_without_those_weights(tmp_path, model, message):
    code, out = _run("repository", str(tmp_path / "repo"), "--model", model)
    assert code == 2 and message in out, out
    assert "drop --pretrained" not in out, out  # was: export's flag, which repository does not have


def test_non_model_file_and_export_folder_are_explained(tmp_path):
    photo = tmp_path / "cat.png"
    Image.new("RGB", (8, 8)).save(photo)
    code, out = _run("repository", str(tmp_path / "repo"), "--model", str(photo))
    assert code == 2 and "is a file but not a model" in out
    exports = tmp_path / "exports"
    exports.mkdir()
    (exports / "model.onnx").write_bytes(b"x")
    code, out = _run("repository", str(tmp_path / "repo"), "--model", str(exports))
    assert code == 2 and "it holds an exported file, which `hub-vit serve` and `hub-vit repository` take" in out \
        and "model.onnx" in out


@pytest.mark.parametrize("command", ["serve", "repository"])
def test_a_weights_file_is_refused_with_what_these_commands_take(tmp_path, command):
    # was: "a weights file needs the architecture: pass --model NAME": serve has no --model, and repository's --model
    # is the option that held the file
    weights = str(default_model_folder() / "model.safetensors")
    args = ["serve", weights, *PORTS] if command == "serve" else ["repository", str(tmp_path / "repo"), "--model",
                                                                  weights]
    code, out = _run(*args)
    assert code == 2 and f"{weights!r} is a weights file, which holds no architecture; give a model folder made " \
                          "from it: hub_vit.save_model_folder(timm.create_model(NAME, checkpoint_path=FILE)" in out, out
    assert "pass --model" not in out and not (tmp_path / "repo").exists()


def test_repository_of_a_hub_model_that_cannot_be_fetched_now_exits_3(tmp_path, monkeypatch):
    # was: exit 1 and "cannot load model 'hf-hub:…': cannot load 'hf-hub:…': ..."; serve and export said it with 3
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    code, out = _run("repository", str(tmp_path / "repo"), "--model", "hf-hub:someorg/somemodel")
    assert code == 3 and out.count("cannot load") == 1 and "hf-hub:someorg/somemodel" in out, out
    assert not (tmp_path / "repo").exists()


def test_repository_onto_a_file_or_the_current_directory(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for extra in ((), ("--overwrite",)):
        code, out = _run("repository", str(afile), *extra)
        assert code == 2 and "is a file; give a folder" in out, out
    code, out = _run("repository", str(afile / "sub"))  # was "[Errno 17] File exists"
    assert code == 2 and f"'{afile}' is a file, so the repository" in out, out
    code, out = _run("repository", str(tmp_path / "repo"))
    assert code == 0, out
    code, out = _run("repository", str(tmp_path / "repo"))
    assert code == 2 and "already exists; pass --overwrite to replace it" in out, out  # the flag, not the keyword
    monkeypatch.chdir(tmp_path / "repo")
    code, out = _run("repository", ".", "--overwrite")
    assert code == 2 and "is the current directory" in out
    assert (tmp_path / "repo" / "hub_vit_repository.json").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = _run("repository", str(empty))  # an empty folder made beforehand is fine without --overwrite
    assert code == 0 and (empty / "hub_vit_repository.json").is_file(), out


@pytest.mark.parametrize("args, message", [
    (("--duration", "nan"), "must be a finite number of seconds > 0, got nan"),
    (("--duration", "inf"), "must be a finite number of seconds > 0, got inf"),
    (("--requests", "0"), "--requests) must be >= 1, got 0"),
    (("--concurrency", "0"), "the requests in flight (--concurrency) must be between 1 and 16384, got 0"),
    # was taken: a million idle workers starved the run's own connections (a spurious 408 from the server's front)
    (("--concurrency", "1000000"), "the requests in flight (--concurrency) must be between 1 and 16384, got 1000000 "
                                   "(one connection each; a server takes 4096 by default: hub-vit serve "
                                   "--max-connections)"),
    (("--batch", "-2"), "the images per request (--batch) must be >= 1, got -2"),
])
def test_loadtest_refuses_runs_that_cannot_end_or_mean_nothing(args, message):
    code, out = _run("loadtest", "--url", "127.0.0.1:18409", *args)  # refused before any connection
    assert code == 2 and message in out, out


@pytest.mark.parametrize("command, flag", [("loadtest", "--model"), ("classify", "--model"),
                                           ("demo", "--triton-model")])
@pytest.mark.parametrize("name", ["", "a/b", "two words"])
def test_a_model_name_that_names_no_model_is_refused_before_any_request(command, flag, name):
    # was: `classify --model ''` sent the request and printed Triton's bare "[404] Not Found"
    code, out = _run(command, flag, name, *(["--port", "1"] if command == "demo" else ["--url", "127.0.0.1:18409"]),
                     *([str(Path(__file__))] if command == "classify" else []))
    assert code == 2 and f"{flag} must name a served model (hub-vit serve's is 'vit'): not empty, without '/', " \
                         f"spaces or control characters; got {name!r}" in out, out


@pytest.mark.parametrize("command", ["loadtest", "classify"])
# 1e300 got Triton's 500 "Unable to parse 'timeout'" (HTTP) or a protobuf error blamed on the image (gRPC)
@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "86400001", "1e300"])
def test_a_request_queue_timeout_must_be_positive(command, value):
    code, out = _run(command, "--url", "127.0.0.1:18409", "--queue-timeout-ms", value, str(Path(__file__)))
    assert code == 2 and ("--queue-timeout-ms must be a positive number of milliseconds, at most one day (86400000), "
                          f"got {float(value)}") in out, out


@pytest.mark.parametrize("message, why", [
    ("in ensemble 'vit', Request timeout expired", "it waited in the server's queue longer than its queue timeout"),
    ("in ensemble 'vit', Exceeds maximum queue size", "the server's queue was full (its --max-queue-size)"),
])
def test_a_shed_grpc_request_is_not_reported_as_no_server(message, why):
    """gRPC answers UNAVAILABLE both when no server listens and when the server sheds load: the words decide."""
    from tritonclient.utils import InferenceServerException

    from hub_vit.server.client.errors import request_failed

    text = request_failed("grpc", "127.0.0.1:8001", InferenceServerException(message, "StatusCode.UNAVAILABLE"))
    assert "the server is overloaded and shed this request: " + why in text, text
    assert "is a server running there" not in text, text
    no_server = InferenceServerException("failed to connect to all addresses", "StatusCode.UNAVAILABLE")
    assert "is a server running there" in request_failed("grpc", "127.0.0.1:8001", no_server)


@pytest.mark.parametrize("protocol, err", [
    ("http", ConnectionRefusedError(111, "Connection refused")),
    ("grpc", "failed to connect to all addresses"),
])
def test_a_server_that_answered_and_then_went_away_is_not_blamed_on_the_port(protocol, err):
    # was: after 64 answers from that port, "is a server running there ..., and is this its HTTP port?"
    from tritonclient.utils import InferenceServerException

    from hub_vit.server.client.errors import request_failed

    if isinstance(err, str):
        err = InferenceServerException(err, "StatusCode.UNAVAILABLE")
    text = " ".join(request_failed(protocol, "127.0.0.1:8000", err, answered=64).split())
    assert "the server at 127.0.0.1:8000 stopped answering after 64 images: it was stopped, or it died" in text, text
    assert "is a server running there" not in text, text
    assert "is a server running there" in request_failed(protocol, "127.0.0.1:8000", err)  # before any answer


def test_a_grpc_client_at_an_http_port_that_answers_is_told_so():
    # serve's front answers a gRPC client's HTTP/2 preface in HTTP/1.1; grpc's own words, as a client got them
    from tritonclient.utils import InferenceServerException

    from hub_vit.server.client.errors import request_failed

    err = InferenceServerException("failed to connect to all addresses; last error: INTERNAL: ipv4:127.0.0.1:8000: "
                                   "Failed parsing HTTP/2 (Expected SETTINGS frame as the first frame, got frame type "
                                   "80) (Trying to connect an http1.x server (HTTP status 400))",
                                   "StatusCode.UNAVAILABLE")
    text = " ".join(request_failed("grpc", "127.0.0.1:8000", err).split())
    assert text.startswith("grpc 127.0.0.1:8000: the port answered in HTTP/1.x, not gRPC's HTTP/2 127.0.0.1:8000 "
                           "speaks HTTP (a server's HTTP port?): leave out --grpc, or give the server's gRPC "
                           "port."), text


def test_grpcs_own_cancel_at_a_servers_stop_says_retry():
    """The status and words a grpc client got for a call its server received as it stopped (a CI run of the drain test;
    grpc/grpc#41785): was the bare "[StatusCode.CANCELLED] CANCELLED", which says neither why nor what to do."""
    from tritonclient.utils import InferenceServerException

    from hub_vit.server.client.errors import request_failed

    text = " ".join(request_failed("grpc", "127.0.0.1:8001",
                                   InferenceServerException("CANCELLED", "StatusCode.CANCELLED")).split())
    assert text == ("grpc 127.0.0.1:8001: [StatusCode.CANCELLED] CANCELLED the server cancelled this request before "
                    "computing it: a gRPC server that stops cancels the calls it has not started yet "
                    "(grpc/grpc#41785); retry once it serves again"), text
    triton = InferenceServerException("in ensemble 'vit', request cancelled", "StatusCode.CANCELLED")  # Triton's words
    assert "grpc/grpc#41785" not in request_failed("grpc", "127.0.0.1:8001", triton)


def test_another_web_server_at_the_url_is_named_as_not_triton(web_page_port):
    # was tritonclient's "[404] an exception occurred in the client while decoding the response: Parse error at offset
    # 0 ... response: <!DOCTYPE HTML> ...", and health's "not ready ... (starting, stopping, or a model failed to load)"
    url = f"127.0.0.1:{web_page_port}"
    image = str(default_model_folder() / "samples" / "3_0.png")
    for command in (["classify", "--url", url, image], ["loadtest", "--requests", "2", "--url", url, image]):
        code, out = _run(*command)
        assert code == 1 and f"{url} answered, but not as Triton does (no Triton JSON): is this a Triton server's " \
            "HTTP port? Defaults: HTTP 8000, gRPC 8001 (--grpc); the demo's page (7860) is not one." in out, out
        assert "DOCTYPE" not in out, out
    code, out = _run("health", "--url", url)
    assert code == 1 and f"http://{url}/v2/health/ready answered HTTP 404: not Triton's HTTP endpoint (Triton " \
        "answers 200 when ready, 400 when not); give the HTTP port of a Triton server, usually 8000" in out, out


@pytest.mark.parametrize("protocol_args", [[], ["--grpc"]], ids=["http", "grpc"])
def test_https_to_a_port_without_tls_says_so(web_page_port, protocol_args):
    # was: "[SSL: WRONG_VERSION_NUMBER] wrong version number" and "no HTTP answer ...: is a server running there?"
    from hub_vit.catalog import default_model_folder

    url = f"https://127.0.0.1:{web_page_port}"  # a plain HTTP server answers the TLS hello in plain text
    code, out = _run("classify", "--url", url, *protocol_args, str(default_model_folder() / "samples" / "3_0.png"))
    assert code == 1 and f"{url} does not speak TLS: give the address without https:// (hub-vit serve's ports speak " \
        "plain HTTP and gRPC; TLS belongs to a proxy in front of them)" in out, out
    assert "is a server running there" not in out, out


def test_health_over_https_to_a_port_without_tls_says_so(web_page_port):
    # was: "no answer from https://...: [SSL: WRONG_VERSION_NUMBER] wrong version number" and nothing more
    url = f"https://127.0.0.1:{web_page_port}"
    code, out = _run("health", "--url", url)
    assert code == 1 and f"{url} does not speak TLS: give the address without https://" in out, out


def test_grpc_core_logs_no_info_lines_above_the_message(web_page_port):
    # was: "I1201 13:48:56 ... ssl_transport_security.cc:2563] Handshake failed with error SSL_ERROR_SSL ..." on stderr
    # before hub-vit's own line, from grpc's core
    import os
    import subprocess

    from hub_vit.catalog import default_model_folder
    from tests.programs import HUB_VIT

    result = subprocess.run([*HUB_VIT, "classify", "--grpc", "--url",
                             f"https://127.0.0.1:{web_page_port}", str(default_model_folder() / "samples" / "3_0.png")],
                            capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"})
    assert result.returncode == 1 and "does not speak TLS" in result.stderr, result.stderr
    assert "Handshake failed" not in result.stderr, result.stderr


def test_timeout_bounds_every_wait_of_classify_and_loadtest(silent_port):
    # a server that takes the connection and stays silent held both for tritonclient's 60 s, whatever --duration said
    import time

    from hub_vit.catalog import default_model_folder

    url = f"127.0.0.1:{silent_port}"
    image = str(default_model_folder() / "samples" / "3_0.png")
    for command in (["classify", "--url", url, "--timeout", "1", image],
                    ["loadtest", "--url", url, "--duration", "1", "--timeout", "1", image]):
        start = time.monotonic()
        code, out = _run(*command)
        assert time.monotonic() - start < 30, command  # with the default of 60 s it took over a minute
        assert code == 1 and "within the client's timeout" in out, (command, out)
    code, out = _run("classify", "--url", url, "--timeout", "0", image)
    assert code == 2 and "--timeout must be a positive number of seconds, got 0.0" in out, out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_that_times_out_is_not_reported_as_no_server(silent_port, protocol):
    # a server that holds a lone request (a long --max-queue-delay-us) was reported as "is a server running there ...
    # is this its HTTP port?" over HTTP, and with no hint at all over gRPC (DEADLINE_EXCEEDED)
    from hub_vit.catalog import default_model_folder
    from hub_vit.server.client.classifier import Classifier
    from hub_vit.server.client.errors import request_failed

    url = f"127.0.0.1:{silent_port}"
    with pytest.raises(Exception) as raised, Classifier(url, protocol=protocol, timeout_s=1) as client:  # noqa: B017
        client.classify([default_model_folder() / "samples" / "3_0.png"])
    text = " ".join(request_failed(protocol, url, raised.value).split())
    assert "within the client's timeout: a server there may be overloaded, or hold lone requests to batch them " \
           "(hub-vit serve --max-queue-delay-us)" in text, text
    assert "is a server running there" not in text, text


def test_loadtest_json_folder_is_refused_before_the_run(tmp_path):
    # nothing listens on the port: an error about the server would mean the run had started
    code, out = _run("loadtest", "--url", "127.0.0.1:18409", "--json", str(tmp_path))
    assert code == 2 and "is a folder; give a file name" in out
    (tmp_path / "file").write_text("x")
    for path, message in ((tmp_path / "file" / "x.json", "is a file"), (tmp_path / "new" / "x.json", "does not exist"),
                          (Path("/proc/x.json"), "cannot write --json '/proc/x.json'")):
        code, out = _run("loadtest", "--url", "127.0.0.1:18409", "--json", str(path))  # failed after the run
        assert code == 2 and message in out, out
    assert not (tmp_path / "new").exists()  # a mistyped folder is not created
    kept = tmp_path / "previous.json"
    kept.write_text("{}")
    code, out = _run("loadtest", "--url", "127.0.0.1:18409", "--json", str(kept))
    assert code == 1 and "no HTTP answer" in out and kept.read_text() == "{}"  # checked, left as it was
    assert "ssl:default" not in out, out  # aiohttp's words for a plain-HTTP connection
    code, out = _run("loadtest", "--url", "127.0.0.1:18409", "--json", str(tmp_path / "fresh.json"))
    assert code == 1 and not (tmp_path / "fresh.json").exists()  # the probe leaves no empty file behind
    link = tmp_path / "latest.json"
    link.symlink_to(tmp_path / "run1.json")  # a link to the file this run is to write
    code, out = _run("loadtest", "--url", "127.0.0.1:18409", "--json", str(link))
    assert code == 1 and link.is_symlink() and not (tmp_path / "run1.json").exists()  # was: link deleted, file made


def test_user_input_is_shown_as_typed():
    code, out = _run("classify", "--url", "127.0.0.1:-1", str(Path(__file__)))
    assert "127.0.0.1:-1" in out and "\N{THUMBS DOWN SIGN}" not in out


def _png_header(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height (no real pixel data)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def test_max_pixels_is_the_limit_and_the_message_names_the_option(imageprep):
    photo_48mp = _png_header(8000, 6000)
    default = imageprep.Preprocess(crop_size=(32, 32), scale_size=(32, 32), **served_eval())
    with pytest.raises(imageprep.BadImageError, match=r"48\.0 MP, more than this server's limit of 40\.0 MP "
                                                       r"\(hub-vit serve --max-pixels\)"):
        default.decode(photo_48mp)
    raised = imageprep.Preprocess(crop_size=(32, 32), scale_size=(32, 32), max_pixels=120_000_000, **served_eval())
    with pytest.raises(imageprep.BadImageError) as err:  # past the size check: only the missing pixels fail
        raised.decode(photo_48mp)
    assert "too large" not in str(err.value)
    with pytest.raises(imageprep.BadImageError) as err:  # 96 MP: above Pillow's 89 MP warning, below the raised limit
        raised.decode(_png_header(12000, 8000))
    assert "too large" not in str(err.value)
    # past Pillow's own limits, whose check runs first: the same message, naming the option (was Pillow's words)
    for size, limit in (((12000, 10000), default), ((50000, 50000), default), ((50000, 50000), raised)):
        with pytest.raises(imageprep.BadImageError, match=rf"it declares {size[0] * size[1] / 1e6:.1f} MP, more than "
                           rf"this server's limit of {limit.max_pixels / 1e6:.1f} MP \(hub-vit serve --max-pixels\)"):
            limit.decode(_png_header(*size))


def test_serve_repository_that_is_a_file_or_serves_another_name(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, out = _run("serve", *PORTS, "--repository", str(afile))
    assert code == 2 and "is a file; give the folder `hub-vit repository` wrote" in out, out
    code, out = _run("repository", str(tmp_path / "repo"), "--name", "digits")
    assert code == 0, out
    code, out = _run("serve", *PORTS, "--repository", str(tmp_path / "repo"), "--name", "other")
    assert code == 2 and "--name 'other': the repository serves 'digits'" in out, out


def test_repository_out_that_cannot_be_made_is_one_line():
    # was a FileNotFoundError traceback: /proc holds no folders a process may make
    code, out = _run("repository", "/proc/hub-vit-no-such/repo")
    assert code == 2 and "cannot create OUT '/proc/hub-vit-no-such/repo': No such file or directory" in out, out
    # a forbidden place (sysfs): was main's safety net, exit 1, without OUT or what was written
    code, out = _run("repository", "/sys/hub-vit-no-such")
    assert code == 2 and "cannot create OUT '/sys/hub-vit-no-such': Operation not permitted; nothing was written" \
        in " ".join(out.split()), out


def test_serve_repository_that_holds_no_model_or_a_stray_folder(tmp_path):
    # was: tritonserver started, loaded the models for seconds, then exited 1 ("failed to load all models"), the reason
    # ("Could not determine backend" of the stray folder) only in its log file
    (tmp_path / "empty").mkdir()
    code, out = _run("serve", *PORTS, "--repository", str(tmp_path / "empty"))
    assert code == 2 and "holds no model (no <model>/config.pbtxt)" in out, out
    code, out = _run("repository", str(tmp_path / "repo"), "--name", "digits")
    assert code == 0, out
    for stray in ("photos", ".hidden"):  # tritonserver takes a hidden folder for a model too
        (tmp_path / "repo" / stray).mkdir()
        code, out = _run("serve", *PORTS, "--repository", str(tmp_path / "repo"))
        assert code == 2 and f"has a folder without a config.pbtxt ({stray!r}): tritonserver would take it for a " \
            "model and fail to start" in out, out
        (tmp_path / "repo" / stray).rmdir()
    # a config Triton cannot parse: named before anything else (was a warning that the repository "differs", then
    # exit 1 from the shared-memory check)
    config = tmp_path / "repo" / "digits_classifier" / "config.pbtxt"
    config.write_text(config.read_text() + "max_batch_size: [\n")
    code, out = _run("serve", *PORTS, "--repository", str(tmp_path / "repo"))
    assert code == 2 and f"--repository: cannot read {config}: " in out and "Couldn't parse integer" in out, out
    assert "warning" not in out, out


def test_try_line_names_a_real_sample_of_the_served_model(tmp_path):
    # a pip-installed user has no checkout path to type: the banner shows the shipped sample wherever pip put it
    from hub_vit.catalog import default_model_folder
    from hub_vit.cli.serve_screen import example_image

    example = Path(example_image(str(default_model_folder())))
    assert example.is_file() and example.parent == default_model_folder() / "samples"
    spaced = tmp_path / "my models" / "samples"
    spaced.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(spaced / "a b.png")
    assert example_image(str(spaced.parent)) == f"'{spaced / 'a b.png'}'"  # quoted: pastes as one argument
    assert example_image(str(tmp_path / "model.onnx")) == "IMAGE..."


def test_try_line_of_a_written_repository_names_a_sample_of_the_model_it_was_written_from(tmp_path):
    # `serve --repository` showed `hub-vit classify ... IMAGE...`: its manifest names the model folder, samples and all
    from hub_vit.catalog import default_model_folder
    from hub_vit.cli.serve import _existing_repository
    from hub_vit.cli.serving_options import SERVE_DEFAULTS
    from hub_vit.resolve import resolve_model
    from hub_vit.server.repository.options import ServingOptions
    from hub_vit.server.repository.writer import write_repository

    sizes = {key: SERVE_DEFAULTS[key] for key in ("max_batch_size", "max_queue_delay_us", "max_queue_size",
                                                  "queue_timeout_us", "queue_policy", "top_k", "max_pixels")}
    repo = write_repository(resolve_model(str(default_model_folder())), tmp_path / "repository", ServingOptions())
    name, example = _existing_repository(repo, model=None, name="vit", **sizes)
    assert name == "vit" and Path(example).parent == default_model_folder() / "samples", example
    (repo / "hub_vit_repository.json").unlink()  # written by hand: nothing says which model it serves
    assert _existing_repository(repo, model=None, name="vit", **sizes) == ("vit", "IMAGE...")


def test_repository_at_a_path_the_python_backend_cannot_serve_from_says_so(tmp_path):
    # written (a container mounts it elsewhere), with a note; `serve --repository` refuses it at once (it waited 120 s)
    repo = tmp_path / "my models" / "repo (1)"
    code, out = _run("repository", str(repo))
    assert code == 0 and (repo / "hub_vit_repository.json").is_file(), out
    assert "note: Triton's Python backend cannot start models from" in out and "space '(' ')'" in out, out
    code, out = _run("serve", *PORTS, "--repository", str(repo))
    assert code == 2 and "breaks at space '(' ')'" in out, out



def test_serve_repository_warns_when_it_is_not_what_this_version_writes(tmp_path):
    # served as it is, but the user learns that it lacks this version's configs / server code (here a path the stub
    # cannot take then stops serve before a server starts)
    repo = tmp_path / "my models" / "repo"
    assert _run("repository", str(repo))[0] == 0
    code, out = _run("serve", *PORTS, "--repository", str(repo))
    assert code == 2 and "warning" not in out, out
    with (repo / "vit_classifier/1/model.py").open("a") as f:
        f.write("# edited\n")
    code, out = _run("serve", *PORTS, "--repository", str(repo))
    assert code == 2 and "breaks at space" in out, out
    from hub_vit import __version__

    assert (f"warning: {repo} is not what this hub-vit ({__version__}) writes for its model and options (written by "
            f"hub-vit {__version__}, or edited since): vit_classifier/1/model.py differs. It is served as it is; "
            "rebuild it with `hub-vit repository`") in out, out

def test_repository_on_a_read_only_file_system_names_the_folder(tmp_path, monkeypatch, capsys):
    import errno
    import tempfile

    from hub_vit.cli import main

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", kwargs.get("dir"))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    monkeypatch.setattr("sys.argv", ["hub-vit", "repository", str(tmp_path / "repo")])
    with pytest.raises(SystemExit) as info:
        main()
    out = " ".join(capsys.readouterr().err.split())
    assert info.value.code == 1, out
    assert f"error: cannot write the Triton repository to '{tmp_path / 'repo'}': Read-only file system" in out, out
    assert ".repo." not in out  # not by its hidden staging folder


def test_serve_warns_loudly_on_a_non_loopback_host():
    # was: `--host 0.0.0.0` gave no warning (gRPC then binds every v4 and v6 address of a 2.51 server)
    code, out = _run("serve", *PORTS, "--host", "0.0.0.0", "--exit-timeout", "-1")  # stops right after the warning
    assert code == 2 and "WARNING: --host 0.0.0.0 serves beyond this machine" in out, out
    assert "CVE-2025-23310" in out and "Dockerfile's container" in out, out
    # was: "it has no request body cap", though the front caps every HTTP and gRPC body; and "the metrics port is
    # Triton's own, not fronted", though serve relays it (server/front/metrics_front.py)
    assert "no request body cap" not in out and "not fronted" not in out, out
    assert "a crashing request the front does not know still kills it (serve restarts it)." in out, out
    code, out = _run("serve", *PORTS, "--exit-timeout", "-1")
    assert "WARNING" not in out, out


def test_serve_refuses_a_tensorrt_engine_and_names_the_container_command(tmp_path: Path) -> None:
    """The tritonserver serve runs has the Python backend only: an engine (with its metadata, so it resolves) is
    refused before anything is built, with the repository command for the GPU container."""
    import json

    from tests.test_resolve import CFG, LABELS

    engine = tmp_path / "model.plan"
    engine.write_bytes(b"not parsed here")
    (tmp_path / "model.plan.json").write_text(json.dumps({
        "precision": "fp16", "profile": {"min": [1, 3, 32, 32], "max": [8, 3, 32, 32]},
        "model": {"pretrained_cfg": CFG, "num_classes": 3, "labels": LABELS}}))
    code, out = _run("serve", *PORTS, str(engine))
    assert code == 2, out
    assert "model.plan is a TensorRT engine, which the tritonserver `hub-vit serve` runs (Python backend only) " \
           "cannot load" in out, out
    assert f"hub-vit repository OUT --model {engine} --flavour gpu --gpu-backend tensorrt" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.plan", "model.plan.json"]


def test_the_clients_refuse_a_model_name_that_names_no_model():
    from hub_vit.server.client import AsyncClassifier, Classifier

    for client in (Classifier, AsyncClassifier):
        with pytest.raises(ValueError, match=r"model must name a served model .* got 'a/b'"):
            client("127.0.0.1:18409", model="a/b")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ready_is_false_where_no_server_answers(silent_port, protocol):
    # was: `if client.ready():` raised ConnectionRefusedError / InferenceServerException UNAVAILABLE with no server
    from hub_vit.server.client.classifier import Classifier
    from hub_vit.server.runtime.launcher import free_port

    for port in (free_port(), silent_port):  # nothing listens; a server that takes the connection and stays silent
        with Classifier(f"127.0.0.1:{port}", protocol=protocol, timeout_s=1.0) as client:
            assert client.ready() is False


@pytest.mark.parametrize("grpc", [False, True])
def test_classify_json_gives_every_file_its_line_when_no_server_answers(tmp_path, grpc):
    # was: the one error on stderr and nothing on stdout, so `| jq` saw no file; the docs promise every file a line
    import json

    from hub_vit.server.runtime.launcher import free_port

    images = []
    for name in ("a.png", "b.png"):
        Image.new("RGB", (8, 8)).save(tmp_path / name)
        images.append(str(tmp_path / name))
    _load_commands()
    result = CliRunner().invoke(app, ["classify", "--url", f"127.0.0.1:{free_port()}", *(["--grpc"] if grpc else []),
                                      "--json", *images])
    assert result.exit_code == 1, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["file"] for line in lines] == images, result.stdout
    reason = " ".join(result.stderr.split()).removeprefix("error: ")
    assert all(line["error"].startswith("not classified: ") and " ".join(line["error"].split())
               == f"not classified: {reason}" for line in lines), (lines, result.stderr)


@pytest.mark.parametrize("protocol, status", [("http", "502"), ("grpc", "StatusCode.UNAVAILABLE")])
def test_a_request_the_server_died_with_is_named_so_not_blamed_on_the_port(protocol, status):
    # was: over gRPC, a server that died during the first request was "no gRPC answer ...: is this its gRPC port?"
    from tritonclient.utils import InferenceServerException

    from hub_vit.server.client.errors import request_failed
    from hub_vit.server.front.checks import LOST

    text = " ".join(request_failed(protocol, "127.0.0.1:8000", InferenceServerException(LOST, status)).split())
    assert "the server at 127.0.0.1:8000 died with this request in flight (hub-vit serve restarts it)" in text, text
    assert "is a server running there" not in text and "[hub-vit" not in text, text
