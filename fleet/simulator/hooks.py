"""The seam where a simulated instance will run something real (the on-box agent as a local process); a hook that raises
is logged and ignored (docs/fleet.md, "fleet/simulator/hooks.py")."""


class InstanceHooks:
    """Does nothing; subclass and override what you need."""

    def on_listening(self, api_url: str) -> None:
        """The marketplace's API is served at `api_url`, where a machine stops itself with its own key."""

    def on_rented(self, instance: dict) -> None:
        """Right after the rent; the container is only being created."""

    def on_running(self, instance: dict) -> None:
        """The boot delay has passed (also after a restart); `cuda_init_error` is set when CUDA cannot start."""

    def on_stopped(self, instance: dict) -> None:
        """Stopped by the user or reclaimed (outbid); the disk is kept."""

    def on_host_died(self, instance: dict) -> None:
        """The host went offline: whatever ran there is gone, including its local disk."""

    def on_hung(self, instance: dict) -> None:
        """The host hangs: the instance stays "running" and billing, but nothing on it makes progress."""

    def on_destroyed(self, instance: dict) -> None:
        """Destroyed through the API, or vanished from the list after its host died."""

    def on_volume_deleted(self, volume_id: int) -> None:
        """A volume was deleted: what it held is gone."""

    def logs(self, instance_id: int) -> str:
        """What ran on the instance printed, for `vastai logs`; called outside the market's lock."""
        return ""
