"""Where the caches (answers, labels, converted models) live."""

from pathlib import Path

from decode.models import cache_root


def test_an_empty_cache_variable_means_the_default_cache_not_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDRAFT_CACHE", "")
    assert cache_root() == Path.home() / ".cache" / "specdraft"
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
