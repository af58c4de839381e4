import openai
import pytest

from tests.conftest import child_env
from tests.routing.conftest import PRICES, budget, key, tiny  # noqa: F401
from tests.servers import AsgiServer

# Small limits, so that tests reach them with small files.
FILE_MAX_BYTES = 20_000
QUOTA_BYTES = 60_000


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def batch_server(django_db_setup, django_db_blocker, files_dir):
    """uvicorn in the embedded mode, its batch runner polling often, its files in a temporary
    directory, with small upload limits."""
    server = AsgiServer(
        child_env(
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_FILES_DIR=str(files_dir),
            FAIRLANE_FILE_MAX_BYTES=str(FILE_MAX_BYTES),
            FAIRLANE_FILES_TENANT_QUOTA_BYTES=str(QUOTA_BYTES),
            FAIRLANE_BATCH_POLL_SECONDS="0.2",
            FAIRLANE_BATCH_IN_FLIGHT="4",
        )
    )
    yield server
    server.stop()


@pytest.fixture
def client(batch_server, key):  # noqa: F811
    return openai.OpenAI(api_key=key, base_url=batch_server.url + "/v1", max_retries=0)
