"""The CPU flavour's variant cache (server/repository/variant_cache.py): a second repository build of the same model
on the same host reuses the graph the first one chose; a damaged entry (truncated, edited, missing file) is detected
by its content digests, removed and rebuilt, never served; the key changes with what the choice depends on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hub_vit.export import criterion, onnx_export
from hub_vit.export.plan import VerificationSet
from hub_vit.host import Host
from hub_vit.resolve import resolve_model as resolve
from hub_vit.server.repository import cpu_variant, variant_cache
from hub_vit.server.repository.options import ServingOptions
from hub_vit.server.repository.writer import MANIFEST, write_repository

CHECK = VerificationSet(n_random=8, n_photos=24, seed=0)


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(variant_cache.ENV, str(root))
    return root


def _key(**parts: object) -> variant_cache.CacheKey:
    return variant_cache.CacheKey({"weights": "tensors-sha256:00", "requested": "auto", **parts})


def _graph(tmp_path: Path) -> list[Path]:
    graph = tmp_path / "graph.onnx"
    graph.write_bytes(b"a graph's bytes" * 1000)
    return [graph]


def test_an_entry_reads_back_what_was_stored(cache: Path, tmp_path: Path) -> None:
    entry = variant_cache.store(_key(), {"variant": "int8-dynamic", "reason": "fastest"}, _graph(tmp_path))
    assert entry is not None and entry.parent == cache
    selection, files = variant_cache.load(_key())
    assert selection == {"variant": "int8-dynamic", "reason": "fastest"}
    assert [f.read_bytes() for f in files] == [(tmp_path / "graph.onnx").read_bytes()]
    assert variant_cache.load(_key(requested="int8-static")) is None  # another key: no entry
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.parametrize("damage", ["truncated", "edited bytes", "missing file", "edited record"])
def test_a_damaged_entry_is_removed_not_served(cache: Path, tmp_path: Path, damage: str) -> None:
    entry = variant_cache.store(_key(), {"variant": "int8-dynamic"}, _graph(tmp_path))
    graph = entry / "graph.onnx"
    if damage == "truncated":
        graph.write_bytes(graph.read_bytes()[:100])
    elif damage == "edited bytes":
        data = bytearray(graph.read_bytes())
        data[500] ^= 0xFF
        graph.write_bytes(bytes(data))
    elif damage == "missing file":
        graph.unlink()
    else:  # another variant written into the record by hand
        record = json.loads((entry / "entry.json").read_text())
        record["selection"]["variant"] = "fp32"
        (entry / "entry.json").write_text(json.dumps(record))
    listed = variant_cache.entries()
    assert len(listed) == 1 and listed[0]["damaged"]
    assert variant_cache.load(_key()) is None
    assert not entry.exists()


def test_a_cache_that_cannot_be_written_costs_only_the_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(variant_cache.ENV, str(blocker / "cache"))
    with pytest.raises(OSError) as refused:
        variant_cache.store(_key(), {"variant": "fp32"}, _graph(tmp_path))
    assert refused.value.filename == str(blocker / "cache")  # the folder to point elsewhere, not a staging file
    assert variant_cache.load(_key()) is None


def test_a_build_whose_cache_cannot_be_written_says_each_start_will_build_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # under an arbitrary user id (OpenShift) ~/.cache is /.cache, which that user cannot write: every start built and
    # timed the variants again, minutes each, and nothing said why
    from hub_vit.server.repository.manifest import cpu_variant_line

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(variant_cache.ENV, str(blocker / "cache"))
    repo = write_repository(resolve(None), tmp_path / "repo", ServingOptions(cpu_variant="int8-dynamic"))
    recorded = json.loads((repo / MANIFEST).read_text())["cpu_variant"]
    assert recorded["variant"] == "int8-dynamic" and recorded["cache"]["entry"] is None
    assert recorded["cache"]["unwritable"] == f"{blocker / 'cache'}: Not a directory"
    assert cpu_variant_line(repo).endswith(
        f"; not kept for later starts: the variant cache '{blocker / 'cache'}' cannot be written (Not a directory), so "
        "each start builds and times the variants again; set HUB_VIT_VARIANT_CACHE to a writable folder)")


def test_the_key_follows_weights_host_libraries_criterion_and_request(monkeypatch: pytest.MonkeyPatch) -> None:
    module = resolve(None).module
    key = variant_cache.cache_key(module, "auto", CHECK, batch=8, threads=2, flags=["avx512_vnni"])
    same = variant_cache.cache_key(module, "auto", CHECK, batch=8, threads=2, flags=["avx512_vnni"])
    assert key.name == same.name
    others = [variant_cache.cache_key(module, "auto", CHECK, batch=8, threads=2, flags=["amx_int8"]),
              variant_cache.cache_key(module, "int8-static", CHECK, batch=8, threads=2, flags=["avx512_vnni"]),
              variant_cache.cache_key(module, "auto", CHECK, batch=4, threads=2, flags=["avx512_vnni"]),
              variant_cache.cache_key(module, "auto", VerificationSet(n_random=8, n_photos=24, seed=1), batch=8,
                                      threads=2, flags=["avx512_vnni"])]
    monkeypatch.setattr(criterion, "MIN_COSINE", 0.995)
    others.append(variant_cache.cache_key(module, "auto", CHECK, batch=8, threads=2, flags=["avx512_vnni"]))
    monkeypatch.setattr(criterion, "MIN_COSINE", 0.99)
    monkeypatch.setattr(variant_cache, "library_versions", lambda: {"onnxruntime": "0.0"})
    others.append(variant_cache.cache_key(module, "auto", CHECK, batch=8, threads=2, flags=["avx512_vnni"]))
    monkeypatch.setattr(variant_cache, "recipe_digest", lambda: "another build recipe")
    others.append(variant_cache.cache_key(module, "auto", CHECK, batch=8, threads=2, flags=["avx512_vnni"]))
    module.head.bias.data[0] += 1  # other weights
    try:
        others.append(variant_cache.cache_key(module, "auto", CHECK, batch=8, threads=2, flags=["avx512_vnni"]))
    finally:
        module.head.bias.data[0] -= 1
    assert len({key.name, *(k.name for k in others)}) == len(others) + 1


def test_the_recipe_is_the_build_code_not_the_version_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edited build module of the same version (an editable install, a patched wheel) is another recipe: entries it
    did not build are not served. Shown on a package of the same shape as `hub_vit.export`."""
    package = tmp_path / "recipe_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "calibrate.py").write_text("CROPS = 'centre first'\n")
    (tmp_path / "recipe_mod.py").write_text("SEED = 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("recipe_pkg", "recipe_mod")
    before = variant_cache.recipe_digest(names)
    (package / "sub" / "calibrate.py").write_text("CROPS = 'random'\n")  # a module deep in the package
    variant_cache.recipe_digest.cache_clear()
    assert variant_cache.recipe_digest(names) != before
    with pytest.raises(ModuleNotFoundError, match="recipe names no_such_recipe_module"):
        variant_cache.recipe_digest(("no_such_recipe_module",))
    variant_cache.recipe_digest.cache_clear()
    assert "hub_vit.export" in variant_cache.RECIPE  # where calibration, quantisation and verification live
    module = resolve(None).module
    key = variant_cache.cache_key(module, "auto", CHECK, batch=8, threads=2, flags=["avx512_vnni"])
    assert key.parts["recipe"] == variant_cache.recipe_digest()


def test_a_second_build_reuses_the_choice_and_a_damaged_entry_is_rebuilt(cache: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host()
    host.openvino_missing = "tested in tests/test_openvino_variants.py"
    monkeypatch.setattr(cpu_variant, "this_host", lambda: host)
    source = resolve(None)
    first = write_repository(source, tmp_path / "first", ServingOptions(cpu_variant="int8-dynamic"))
    recorded = json.loads((first / MANIFEST).read_text())["cpu_variant"]
    assert recorded["cache"]["hit"] is False and Path(recorded["cache"]["entry"]).parent == cache
    graph = first / "vit_classifier" / "1" / "model.onnx"

    real_select = cpu_variant.select
    with monkeypatch.context() as patched:  # neither the candidates nor the fp32 graphs are built again
        patched.setattr(cpu_variant, "select", lambda *args, **kwargs: pytest.fail("rebuilt a cached variant"))
        patched.setattr(onnx_export, "export_onnx", lambda *args, **kwargs: pytest.fail("exported the graphs again"))
        second = write_repository(source, tmp_path / "second", ServingOptions(cpu_variant="int8-dynamic"))
    reused = json.loads((second / MANIFEST).read_text())["cpu_variant"]
    assert reused["cache"]["hit"] is True and reused["variant"] == "int8-dynamic"
    assert reused["reason"].endswith("reused from the variant cache (built and verified earlier on this host)")
    for name in ("model.onnx", "model_attentions.onnx"):
        assert (second / "vit_classifier" / "1" / name).read_bytes() == (first / "vit_classifier" / "1" /
                                                                          name).read_bytes()

    cached = Path(recorded["cache"]["entry"]) / "model.int8-dynamic.onnx"
    cached.write_bytes(cached.read_bytes()[: cached.stat().st_size // 2])  # truncated
    calls = []
    monkeypatch.setattr(cpu_variant, "select", lambda *args, **kwargs: calls.append(1) or real_select(*args, **kwargs))
    third = write_repository(source, tmp_path / "third", ServingOptions(cpu_variant="int8-dynamic"))
    assert calls == [1] and json.loads((third / MANIFEST).read_text())["cpu_variant"]["cache"]["hit"] is False
    assert (third / "vit_classifier" / "1" / "model.onnx").read_bytes() == graph.read_bytes()  # rebuilt, whole


def test_a_build_hashes_the_weights_once_for_both_cache_keys(cache: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU flavour's fp32 graphs and its variant are cached under keys that both name the weights' digest: it is
    computed once per build (it hashes every weight: seconds for a ViT-B), not once per key."""
    from hub_vit import weights_digest

    host = Host()
    host.openvino_missing = "tested in tests/test_openvino_variants.py"
    monkeypatch.setattr(cpu_variant, "this_host", lambda: host)
    real, calls = weights_digest.state_dict_digest, []
    monkeypatch.setattr(weights_digest, "state_dict_digest", lambda state: calls.append(1) or real(state))
    source = resolve(None)
    repo = write_repository(source, tmp_path / "repo", ServingOptions(cpu_variant="int8-dynamic"))
    assert calls == [1]
    assert {entry["variant"] for entry in variant_cache.entries()} == {"fp32 graphs", "int8-dynamic"}
    assert source.weights_digest == real(source.module.state_dict())
    assert json.loads((repo / MANIFEST).read_text())["cpu_variant"]["cache"]["hit"] is False


def test_the_cache_command_lists_and_clears(cache: Path, tmp_path: Path) -> None:
    from hub_vit.cli import _load_commands, app

    variant_cache.store(_current(), {"variant": "int8-dynamic"}, _graph(tmp_path))
    _load_commands()
    listed = CliRunner().invoke(app, ["cache", "list"])
    assert listed.exit_code == 0 and "int8-dynamic" in listed.output and "whole" in listed.output
    cleared = CliRunner().invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and "removed 1 cached variant from" in " ".join(cleared.output.split())
    assert variant_cache.entries() == []


def test_the_cache_command_refuses_a_cache_that_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # was: "variant cache: .../afile (0 entries)" and "removed 0 cached variants", exit 0, as for an empty cache
    from hub_vit.cli import _load_commands, app

    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    monkeypatch.setenv(variant_cache.ENV, str(a_file))
    _load_commands()
    for command in ("list", "clear"):
        result = CliRunner().invoke(app, ["cache", command])
        assert result.exit_code == 2 and f"$HUB_VIT_VARIANT_CACHE names '{a_file}', which is a file; the cache is a " \
                                         "folder" in " ".join(result.output.split()), result.output
    assert a_file.read_text() == "mine"
    # a file above the caches (HUB_VIT_CACHE=/etc/passwd): was "download cache: /etc/passwd/downloads (0
    # checkpoints)", exit 0
    monkeypatch.delenv(variant_cache.ENV)
    monkeypatch.setenv("HUB_VIT_CACHE", str(a_file))
    for command in ("list", "clear"):
        result = CliRunner().invoke(app, ["cache", command])
        assert result.exit_code == 2 and f"$HUB_VIT_CACHE names '{a_file}', so the variant cache is " \
                                         f"'{a_file / variant_cache.cache_root().name}': '{a_file}', a folder above" \
                                         in " ".join(result.output.split()), result.output
    assert a_file.read_text() == "mine"


def test_clear_removes_the_cache_s_entries_and_nothing_else_in_its_folder(cache: Path, tmp_path: Path) -> None:
    # $HUB_VIT_VARIANT_CACHE may name a folder that holds other things: clear removed the whole folder
    from hub_vit.cli import _load_commands, app

    entry = variant_cache.store(_key(), {"variant": "int8-dynamic"}, _graph(tmp_path))
    leftover = cache / f".{'0' * 64}.tmp-host-1-abcdefgh"  # a killed writer's staging folder
    leftover.mkdir()
    (cache / "notes.txt").write_text("mine")
    (cache / "results").mkdir()
    _load_commands()
    assert [Path(e["entry"]) for e in variant_cache.entries()] == [entry]  # the user's folder is no entry either
    cleared = CliRunner().invoke(app, ["cache", "clear"])
    flat = " ".join(cleared.output.split())
    assert cleared.exit_code == 0 and "removed 1 cached variant from" in flat, flat
    assert "left 2 other files there (not cache entries)" in flat, flat
    assert not entry.exists() and not leftover.exists()
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt", "results"]


def test_clear_says_so_when_an_entry_cannot_be_removed(cache: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # was: the error was swallowed and "removed 1 cached variant" printed, exit 0
    import errno
    import shutil

    from hub_vit.cli import _load_commands, app

    entry = variant_cache.store(_key(), {"variant": "int8-dynamic"}, _graph(tmp_path))

    def read_only(path: Path, *args: object, **kwargs: object) -> None:  # as on a read-only mount (root ignores modes)
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(shutil, "rmtree", read_only)
    _load_commands()
    cleared = CliRunner().invoke(app, ["cache", "clear"])
    flat = " ".join(cleared.output.split())
    assert cleared.exit_code == 1, flat
    assert f"cannot clear the variant cache: Read-only file system: {str(entry)!r}" in flat, flat
    assert "removed" not in flat


def _current(**changed: object) -> variant_cache.CacheKey:
    """A key holding this installation's and this host's parts (as `cache_key` writes them), with `changed` replaced."""
    from hub_vit.host import isa_flags

    here = {"format": variant_cache.FORMAT, "libraries": variant_cache.library_versions(),
            "recipe": variant_cache.recipe_digest(), "isa_flags": isa_flags()}
    return _key(**(here | changed))


def test_stale_names_what_no_start_here_can_match() -> None:
    assert variant_cache.stale(_current().parts) is None
    assert variant_cache.stale({k: v for k, v in _current().parts.items() if k != "isa_flags"}) is None  # fp32 graphs
    older = variant_cache.library_versions() | {"torch": "2.0.0", "nncf": None}
    assert variant_cache.stale(_current(libraries=older).parts) == "built with nncf absent, torch 2.0.0"
    assert variant_cache.stale(_current(recipe="0" * 64).parts) == "built by other hub-vit code"
    assert variant_cache.stale(_current(isa_flags=["avx2", "amx_int8"]).parts) == "built on another CPU"
    assert variant_cache.stale(_current(format=0).parts).startswith("another entry format")
    assert variant_cache.stale(None).startswith("another entry format")


def test_clear_stale_keeps_what_a_start_here_can_reuse(cache: Path, tmp_path: Path) -> None:
    from hub_vit.cli import _load_commands, app

    reusable = variant_cache.store(_current(), {"variant": "int8-dynamic"}, _graph(tmp_path))
    other_code = variant_cache.store(_current(recipe="0" * 64), {"variant": "openvino-int8"}, _graph(tmp_path))
    other_cpu = variant_cache.store(_current(isa_flags=["amx_int8"]), {"variant": "openvino-int8"}, _graph(tmp_path))
    damaged = variant_cache.store(_current(requested="int8-static"), {"variant": "int8-static"}, _graph(tmp_path))
    (damaged / "graph.onnx").write_bytes(b"other bytes")
    _load_commands()
    listed = CliRunner().invoke(app, ["cache", "list"])  # piped: tab-separated, whole paths
    assert listed.exit_code == 0, listed.output
    rows = {line.split("\t")[-1]: line.split("\t") for line in listed.output.splitlines() if "\t" in line}
    assert rows[str(reusable)][4] == "whole" and rows[str(other_cpu)][4] == "stale: built on another CPU"
    assert rows[str(other_code)][4] == "stale: built by other hub-vit code"
    assert rows[str(damaged)][4] == "graph.onnx has other bytes than were written"
    assert "(4 entries, 2 stale)" in listed.output
    cleared = CliRunner().invoke(app, ["cache", "clear", "--stale"])
    flat = " ".join(cleared.output.split())
    assert cleared.exit_code == 0 and "removed 3 stale or damaged cached variants from" in flat, flat
    assert [Path(e["entry"]) for e in variant_cache.entries()] == [reusable]
