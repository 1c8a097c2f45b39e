"""The built-in tools keep out of the way of what is not theirs: shell commands (foreground and in
the background) run without provider keys, tokens and secrets unless allowed, and `list` and
`grep` skip what git ignores (`.gitignore` files, nested ones too, and `.git/info/exclude`) while a
path naming an ignored file still reaches it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.config import SHELL_ENV_ALLOW_VARIABLE, SHELL_ENV_DENY_VARIABLE, client_setup, tool_workspace
from harness.context import Context
from harness.conversation import ConversationService, ExecutionTarget
from harness.messages import ModelIdentity
from harness.providers import ModelRegistry
from harness.runtime import ToolOutput
from harness.session import LaneConfig, connect
from harness.tools import ApprovalPolicy, BackgroundJobs, Workspace
from harness.tools.workspace import TOOL_ENVIRONMENT
from tool_helpers import Progress, call, details, text

pytest_plugins = ["tool_fixtures"]  # root and workspace

DENIED = {
    "OPENAI_API_KEY": "sk-openai", "ANTHROPIC_API_KEY": "sk-ant", "ANTHROPIC_AUTH_TOKEN": "t",
    "OPENAI_ORG_ID": "org", "GROQ_API_KEY": "gsk", "GPU_BOX_KEY": "k", "GITHUB_TOKEN": "ghp",
    "AWS_SECRET_ACCESS_KEY": "aws", "AWS_SESSION_TOKEN": "s", "PGPASSWORD": "pw", "CLIENT_SECRET_VALUE": "c",
    "GOOGLE_APPLICATION_CREDENTIALS": "/creds.json", "lower_api_key": "l",
}
PASSED = {"SAFETY_PLAIN_SETTING": "plain", "HARNESS_HOME": "/some/home", "HARNESS_STORE": "sqlite:///x.db"}


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**DENIED, **PASSED}.items():
        monkeypatch.setenv(name, value)


def seen(output: ToolOutput) -> dict[str, str]:
    """The variables an `env -0` command printed."""
    assert not output.is_error, text(output)
    return dict(line.split("=", 1) for line in text(output).split("\0") if "=" in line)


# -- the shell's environment ------------------------------------------------------------------------


@pytest.mark.usefixtures("environment")
async def test_a_shell_command_sees_no_key_token_or_secret_of_this_process(workspace: Workspace) -> None:
    variables = seen(await call(workspace, "shell", {"command": "env -0"}))

    assert not DENIED.keys() & variables.keys()
    assert {name: variables.get(name) for name in PASSED} == PASSED
    assert variables["PATH"]


@pytest.mark.usefixtures("environment")
async def test_an_allowed_variable_passes_and_the_others_stay_out(root: Path, tmp_path: Path) -> None:
    workspace = Workspace(root=root, output_dir=tmp_path / "out", env_allow=("GITHUB_TOKEN",),
                          env_deny=("*TOKEN", "*API_KEY*", "SAFETY_*"))

    variables = seen(await call(workspace, "shell", {"command": "env -0"}))

    assert variables["GITHUB_TOKEN"] == "ghp"
    assert "OPENAI_API_KEY" not in variables
    assert "SAFETY_PLAIN_SETTING" not in variables  # the deny list is the workspace's, not only the default
    assert variables["PGPASSWORD"] == "pw"


@pytest.mark.usefixtures("environment")
async def test_a_background_job_runs_without_the_keys_too(workspace: Workspace) -> None:
    jobs = BackgroundJobs()
    started = await call(workspace, "shell", {"command": "echo \"[$OPENAI_API_KEY][$SAFETY_PLAIN_SETTING]\"",
                                              "background": "job"}, jobs=jobs)
    assert not started.is_error, text(started)
    job = jobs.jobs("conversation-1")[0]
    assert job.follower is not None
    await job.follower

    assert "[][plain]" in text(await call(workspace, "jobs", {"action": "output", "job": job.id}, jobs=jobs))


@pytest.mark.usefixtures("environment")
async def test_what_the_running_code_adds_on_purpose_is_never_filtered(workspace: Workspace) -> None:
    """A garden's driver hands its run context to its commands through `TOOL_ENVIRONMENT`."""
    token = TOOL_ENVIRONMENT.set({"RUN_TOKEN": "given"})
    try:
        variables = seen(await call(workspace, "shell", {"command": "env -0"}))
    finally:
        TOOL_ENVIRONMENT.reset(token)

    assert variables["RUN_TOKEN"] == "given"


def test_the_client_reads_its_allow_and_deny_lists_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(SHELL_ENV_ALLOW_VARIABLE, "GITHUB_TOKEN, NPM_*")
    monkeypatch.setenv(SHELL_ENV_DENY_VARIABLE, "DATABASE_URL")

    workspace = tool_workspace(tmp_path, tmp_path)

    assert workspace.passes("GITHUB_TOKEN")
    assert workspace.passes("NPM_TOKEN")
    assert not workspace.passes("DATABASE_URL")
    assert not workspace.passes("OPENAI_API_KEY")  # the default list still applies
    assert workspace.passes("SAFETY_PLAIN_SETTING")


async def test_the_client_also_keeps_each_model_key_of_its_registry_out(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A key named in models.toml that no pattern catches is kept out all the same."""
    monkeypatch.setenv("MY_LLM_CREDS", "secret")
    (tmp_path / "models.toml").write_text(
        '[providers.box]\napi = "openai-chat"\nbase_url = "http://box:8000/v1"\napi_key_env = "MY_LLM_CREDS"\n'
        '[[providers.box.models]]\nid = "m"\n')
    registry = ModelRegistry.load(home=tmp_path)
    setup = client_setup(registry, tool_workspace(tmp_path, tmp_path), tmp_path, ApprovalPolicy(None), BackgroundJobs())
    assert setup.tools_for is not None

    shell = {tool.name: tool for tool in setup.tools_for(ExecutionTarget("c", None, tmp_path))}["shell"]
    output = await shell.execute("call-1", {"command": "echo \"[$MY_LLM_CREDS]\""}, Progress(), Context())

    assert text(output).strip() == "[]"


@pytest.mark.usefixtures("environment")
async def test_the_persons_own_shell_command_runs_without_the_keys_too(tmp_path: Path, ctx: Context) -> None:
    """`!cmd` in a chat and a server's `POST .../shell` both run through the service the doors
    build (`client_setup`): the person's command gets the agent's environment, not the keys."""
    store = await connect("memory://", ctx)
    registry = ModelRegistry.load(home=tmp_path)
    setup = client_setup(registry, tool_workspace(tmp_path, tmp_path), tmp_path, ApprovalPolicy(None), BackgroundJobs())
    service = ConversationService(store, setup)
    conversation = await service.create("u", LaneConfig(model=ModelIdentity(provider="faux", model_id="faux")), ctx)

    row, _ = await service.run_local_shell("u", conversation.id, "env -0", tmp_path, ctx)
    await conversation.dispose(ctx)
    await store.close(ctx)

    variables = dict(line.split("=", 1) for line in row.output.split("\0") if "=" in line)
    assert not set(DENIED) & set(variables)
    assert {name: variables.get(name) for name in PASSED} == PASSED


# -- .gitignore ---------------------------------------------------------------------------------


@pytest.fixture
def repository(root: Path) -> Path:
    """A repository with ignored files at the top, in a nested directory (by its own .gitignore,
    which also re-includes one), under an ignored directory and by `.git/info/exclude`."""
    (root / ".git" / "info").mkdir(parents=True)
    (root / ".git" / "info" / "exclude").write_text("local.txt\n")
    (root / ".git" / "config").write_text("needle in git\n")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "main.py").write_text("needle = 1\n")
    (root / "app.log").write_text("needle in a log\n")
    (root / "local.txt").write_text("needle, local\n")
    (root / "build").mkdir()
    (root / "build" / "out.py").write_text("needle built\n")
    (root / "sub").mkdir()
    (root / "sub" / ".gitignore").write_text("secret.txt\n!keep.log\n")
    (root / "sub" / "code.py").write_text("needle here\n")
    (root / "sub" / "secret.txt").write_text("needle secret\n")
    (root / "sub" / "keep.log").write_text("needle kept\n")
    (root / "sub" / "other.log").write_text("needle other\n")
    return root


@pytest.mark.usefixtures("repository")
async def test_grep_skips_what_git_ignores_nested_rules_included(workspace: Workspace) -> None:
    output = await call(workspace, "grep", {"pattern": "needle"})

    assert text(output).splitlines()[:3] == ["main.py:1:needle = 1", "sub/code.py:1:needle here",
                                             "sub/keep.log:1:needle kept"]
    # Ignored: app.log, build/, local.txt, sub/secret.txt and sub/other.log.
    assert (details(output)["matches"], details(output)["ignored"]) == (3, 5)
    assert "5 paths ignored by .gitignore" in text(output)


@pytest.mark.usefixtures("repository")
async def test_list_leaves_out_what_git_ignores_and_says_how_many(workspace: Workspace) -> None:
    output = await call(workspace, "list", {"depth": 3})

    assert text(output).splitlines()[:-1] == [".git/", ".gitignore", "main.py", "sub/", "sub/.gitignore",
                                              "sub/code.py", "sub/keep.log"]
    assert "5 paths ignored by .gitignore not shown" in text(output).splitlines()[-1]


@pytest.mark.usefixtures("repository")
async def test_an_ignored_file_or_directory_named_as_the_path_is_reached(workspace: Workspace) -> None:
    read = await call(workspace, "read", {"path": "app.log"})
    grepped_file = await call(workspace, "grep", {"pattern": "needle", "path": "sub/secret.txt"})
    grepped_dir = await call(workspace, "grep", {"pattern": "needle", "path": "build"})
    listed = await call(workspace, "list", {"path": "build"})

    assert text(read) == "needle in a log\n"
    assert text(grepped_file) == "sub/secret.txt:1:needle secret"
    assert text(grepped_dir) == "build/out.py:1:needle built"
    assert text(listed) == "out.py"


async def test_the_repository_rules_apply_to_a_workspace_inside_it(repository: Path, tmp_path: Path) -> None:
    """Working in `sub/`, the root's `*.log` still ignores `other.log`; `keep.log` is re-included."""
    workspace = Workspace(root=repository / "sub", output_dir=tmp_path / "out")

    output = await call(workspace, "list", {})

    assert text(output).splitlines()[:-1] == [".gitignore", "code.py", "keep.log"]


async def test_outside_a_repository_the_workspace_gitignore_still_counts(workspace: Workspace, root: Path) -> None:
    (root / ".gitignore").write_text("dist/\n")
    (root / "dist").mkdir()
    (root / "dist" / "bundle.js").write_text("needle\n")
    (root / "src").mkdir()
    (root / "src" / "app.js").write_text("needle\n")

    output = await call(workspace, "grep", {"pattern": "needle"})

    assert text(output).splitlines()[0] == "src/app.js:1:needle"
    assert (details(output)["matches"], details(output)["ignored"]) == (1, 1)
