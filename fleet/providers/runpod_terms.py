"""What every RunPod pod of the product is deployed with, and so what each RunPod offer can promise: RunPod lists GPU
types, not hosts, but its deploy call takes host constraints (CUDA versions, bandwidth floors), so an offer's CUDA,
driver and bandwidth are the floors the rent sends (docs/fleet.md, "RunPod offers")."""

from dataclasses import dataclass, field

# The CUDA versions RunPod hosts report, as `allowedCudaVersions` takes them (an exact set: a version no host reports
# matches nothing, so listing later ones is harmless).
CUDA_VERSIONS = ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7", "12.8", "12.9", "13.0",
                 "13.1", "13.2")
# RunPod publishes no per-host reliability. Secure Cloud runs in RunPod's own data centres, Community Cloud on
# third-party hosts; the product counts them at these figures, an assumption it states, not a measurement.
RELIABILITY = {"SECURE": 0.99, "COMMUNITY": 0.95}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


@dataclass(frozen=True)
class PodTerms:
    cuda_floor: str = "12.8"  # the worker image's CUDA: only hosts at or above it
    min_driver: str = "570"  # the driver that CUDA floor implies, which the offer then states
    disk_gb: int = 250  # the container disk the product rents by default
    min_download_mbps: int = 250
    min_upload_mbps: int = 200
    reliability: dict = field(default_factory=lambda: dict(RELIABILITY))

    def allowed_cuda_versions(self) -> list[str]:
        floor = _version(self.cuda_floor)
        return [version for version in CUDA_VERSIONS if _version(version) >= floor]

    def deploy_fields(self) -> dict:
        """The deploy input's host constraints that make the offer's figures hold."""
        return {"allowedCudaVersions": self.allowed_cuda_versions(), "minDownload": self.min_download_mbps,
                "minUpload": self.min_upload_mbps}
