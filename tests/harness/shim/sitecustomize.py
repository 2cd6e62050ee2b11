# TEST HARNESS ONLY: put on PYTHONPATH of host subprocesses started by the tests.
import spec_ext_placeholders

spec_ext_placeholders.install()
