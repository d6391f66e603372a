"""Running the real `tritonserver` on a written repository: finding it (`triton_install`), the stubs' Python
environment (`stub_env`), its workspace, processes and log (`workspace`, `processes`, `triton_log`), its restricted
control APIs (`api_access`), the process itself (`launcher`), keeping it serving (`supervisor`), the device it serves
on (`device`) and probing it from outside (`health`).
"""
