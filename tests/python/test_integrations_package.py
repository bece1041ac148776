"""pagedkv.integrations ships in the base package and needs nothing beyond it: torch and
transformers are imported by pagedkv.integrations.transformers alone (tests/integrations, run by
scripts/test-integrations, test that module itself)."""
import subprocess
import sys

BLOCK_TORCH = "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True,
                          text=True)


def test_the_base_package_and_integrations_import_without_torch():
    result = run("import pagedkv, pagedkv.integrations; print('ok')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_transformers_integration_says_it_needs_torch():
    result = run("import pagedkv.integrations.transformers")
    assert result.returncode != 0
    assert "ImportError" in result.stderr or "ModuleNotFoundError" in result.stderr
