"""evjax.print_diagnostics (brainevent's name, issue 31)."""
import importlib.metadata

import jax

import evjax


def test_print_diagnostics_prints_versions_platforms_backends_cache_and_threads(capsys):
    assert evjax.print_diagnostics() is None
    out = capsys.readouterr().out
    assert out.startswith("evjax diagnostics")
    for label, dist in (("evjax", "evjax"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("numba", "numba")):
        assert f"  {label:<11} {importlib.metadata.version(dist)}" in out
    assert "  warp " in out and "  numba-cuda " in out
    assert f"default     {jax.default_backend()}" in out
    assert f"cpu:{jax.devices('cpu')[0].id}" in out
    assert f"Cache dir:    {evjax.get_cache_dir()}" in out
    assert f"Threads:      {evjax.get_num_threads()}" in out
    for family in ("csr:", "fixed:", "dense:", "jitc:", "plasticity:"):
        assert f"  {family}" in out
    for name in evjax.get_all_primitive_names():
        assert f"    {name} " in out, name
    line = next(x for x in out.splitlines() if x.strip().startswith("evjax_binary_csrmv "))
    assert "cpu: " in line and "gpu: " in line and "reference" in line


def test_print_diagnostics_follows_the_cache_dir_and_brackets_missing_libraries(capsys, tmp_path, monkeypatch):
    from evjax import registry

    monkeypatch.setenv("EVJAX_CACHE_DIR", str(tmp_path))  # what set_cache_dir sets; restored after the test
    monkeypatch.setitem(registry._missing, "warp", "warp is not installed (test)")
    evjax.print_diagnostics()
    out = capsys.readouterr().out
    assert f"Cache dir:    {tmp_path}" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("evjax_binary_csrmv "))
    assert "(not installed: warp)" in line
