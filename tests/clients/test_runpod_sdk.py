"""The official RunPod Python SDK's pod functions against the RunPod stand-in the product's own client is tested on."""

from decimal import Decimal

from fleet import actions
from fleet.providers.errors import OfferUnavailable
from fleet.providers.records import RentRequest, VolumeMount
from fleet.providers.runpod import RunPodClient
from tests.fleet.runpod_server import NO_CAPACITY, RUNPOD_KEY

IMAGE = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"


def test_it_lists_gpu_types_and_one_type_with_its_lowest_price(runpod_sdk):
    everything, h200 = runpod_sdk.calls([("get_gpus", {}), ("get_gpu", {"gpu_id": "NVIDIA H200", "gpu_quantity": 2})])
    assert {"NVIDIA H200", "NVIDIA B200"} <= {g["id"] for g in everything["value"]}
    assert set(everything["value"][0]) == {"id", "displayName", "memoryInGb"}  # only what the query selected
    h200 = h200["value"]
    assert (h200["id"], h200["memoryInGb"], h200["maxGpuCount"]) == ("NVIDIA H200", 141, 8)
    assert h200["lowestPrice"] == {"minimumBidPrice": 1.99, "uninterruptablePrice": 3.59}


def test_it_creates_gets_stops_resumes_and_terminates_a_pod(runpod_sdk, runpod_fake):
    created = runpod_sdk.value("create_pod", name="sdk-pod", image_name=IMAGE, gpu_type_id="NVIDIA H200",
                               cloud_type="SECURE", ports="8000/tcp,22/tcp", env={"RUN": "3"},
                               container_disk_in_gb=50)
    pod_id = created["id"]
    assert created["imageName"] == IMAGE and created["env"] == ["RUN=3"] and created["machine"]["podHostId"]
    pod = runpod_fake.pods[pod_id]
    assert (pod.cloud_type, pod.cost_per_hr, pod.container_disk_gb) == ("SECURE", 3.99, 50)

    first, second, listing = runpod_sdk.calls([("get_pod", {"pod_id": pod_id}), ("get_pod", {"pod_id": pod_id}),
                                               ("get_pods", {})])
    assert first["value"]["desiredStatus"] == "CREATED" and first["value"]["runtime"] is None
    running = second["value"]
    assert running["desiredStatus"] == "RUNNING" and running["machine"] == {"gpuDisplayName": "H200"}
    public = {p["privatePort"] for p in running["runtime"]["ports"] if p["isIpPublic"]}
    assert public == {8000, 22}
    assert [p["id"] for p in listing["value"]] == [pod_id]

    stopped, resumed, terminated, after = runpod_sdk.calls([
        ("stop_pod", {"pod_id": pod_id}), ("resume_pod", {"pod_id": pod_id, "gpu_count": 1}),
        ("terminate_pod", {"pod_id": pod_id}), ("get_pod", {"pod_id": pod_id})])
    assert stopped["value"] == {"id": pod_id, "desiredStatus": "EXITED"}
    assert resumed["value"]["desiredStatus"] == "RUNNING"
    assert terminated == {"value": None} and after == {"value": None}
    assert runpod_fake.pods == {}


def test_it_lets_any_cloud_take_the_cheaper_one(runpod_sdk, runpod_fake):
    pod_id = runpod_sdk.value("create_pod", name="any", image_name=IMAGE, gpu_type_id="NVIDIA H200")["id"]
    assert (runpod_fake.pods[pod_id].cloud_type, runpod_fake.pods[pod_id].cost_per_hr) == ("COMMUNITY", 3.59)


def test_it_raises_the_sdk_errors(runpod_sdk, runpod_fake):
    runpod_fake.capacity_gone("NVIDIA B200")
    wrong_key = runpod_sdk.calls([("get_pods", {})], api_key="not-the-key")[0]
    assert wrong_key == {"error": "AuthenticationError", "message": "Unauthorized request, please check your API key."}
    unknown_gpu, no_capacity, unknown_pod, stop_unknown = runpod_sdk.calls([
        ("create_pod", {"name": "x", "image_name": IMAGE, "gpu_type_id": "NVIDIA NOPE"}),
        ("create_pod", {"name": "x", "image_name": IMAGE, "gpu_type_id": "NVIDIA B200", "cloud_type": "SECURE"}),
        ("terminate_pod", {"pod_id": "nope"}),
        ("stop_pod", {"pod_id": "nope"}),
    ])
    assert unknown_gpu["error"] == "ValueError" and "No GPU found" in unknown_gpu["message"]
    assert no_capacity == {"error": "QueryError", "message": NO_CAPACITY}
    assert unknown_pod == stop_unknown == {"error": "QueryError", "message": "Pod not found"}
    assert runpod_fake.pods == {}


def test_it_sees_the_pod_the_product_rented_and_the_product_sees_the_sdk_stop(runpod_sdk, runpod_fake):
    client = RunPodClient(runpod_fake.base_url, RUNPOD_KEY, max_retries=1, timeout_s=5)
    try:
        pod_id = client.rent(RentRequest(offer_id="NVIDIA H200:SECURE:1", image=IMAGE, disk_gb=250, label="run-5",
                                         env={"RUN": "5"}))
        listing = runpod_sdk.value("get_pods")
        assert [(p["id"], p["name"], p["containerDiskInGb"], p["env"]) for p in listing] == [
            (pod_id, "run-5", 250, ["RUN=5"])]
        runpod_sdk.value("stop_pod", pod_id=pod_id)
        stopped = client.get_instance(pod_id)
        # The user stopped it: "exited" as vast.ai says it, wanted stopped, so not a failed box.
        assert (stopped.status, stopped.intended_status, actions.failure_of(stopped)) == ("exited", "stopped", "")
        runpod_sdk.value("resume_pod", pod_id=pod_id, gpu_count=1)
        resumed = client.get_instance(pod_id)
        assert (resumed.status, resumed.intended_status) == ("running", "running")
        runpod_sdk.value("terminate_pod", pod_id=pod_id)
        assert client.list_instances() == [] and client.destroy(pod_id) is False
    finally:
        client.close()


def test_it_reads_the_user_with_its_key_and_network_volumes(runpod_sdk, runpod_fake):
    volume_id = runpod_fake.add_network_volume("weights", 200, "US-KS-2")
    empty, updated, user = runpod_sdk.calls([
        ("get_user", {}), ("update_user_settings", {"pubkey": "ssh-ed25519 AAAA k"}), ("get_user", {})])
    assert empty["value"]["pubKey"] == "" and updated["value"]["pubKey"] == "ssh-ed25519 AAAA k"
    assert user["value"] == {"id": "user_simulated", "pubKey": "ssh-ed25519 AAAA k", "networkVolumes": [
        {"id": volume_id, "name": "weights", "size": 200, "dataCenterId": "US-KS-2"}]}


def test_it_deploys_on_a_network_volume_in_its_data_centre(runpod_sdk, runpod_fake):
    volume_id = runpod_fake.add_network_volume("weights", 200, "US-KS-2")
    created = runpod_sdk.value("create_pod", name="on-volume", image_name=IMAGE, gpu_type_id="NVIDIA H200",
                               network_volume_id=volume_id, volume_mount_path="/models")
    pod = runpod_fake.pods[created["id"]]
    # The SDK looked the volume's data centre up through get_user and deployed there.
    assert (pod.network_volume_id, pod.data_center_id) == (volume_id, "US-KS-2")
    assert runpod_fake.count("myself") == 1
    read = runpod_sdk.value("get_pod", pod_id=created["id"])
    assert read["volumeMountPath"] == "/models"
    unknown = runpod_sdk.calls([("create_pod", {"name": "x", "image_name": IMAGE, "gpu_type_id": "NVIDIA H200",
                                                "network_volume_id": "nope", "data_center_id": "US-KS-2"})])[0]
    assert unknown == {"error": "QueryError", "message": "Network volume nope not found"}


def test_the_product_lists_network_volumes_and_deploys_on_one_as_the_sdk_does(runpod_sdk, runpod_fake):
    volume_id = runpod_fake.add_network_volume("qwen", 1200, "US-KS-2")
    client = RunPodClient(runpod_fake.base_url, RUNPOD_KEY, max_retries=1, timeout_s=5)
    try:
        (volume,) = client.list_volumes()
        assert (volume.volume_id, volume.name, volume.size_gb, volume.data_center_id, volume.usable) == (
            volume_id, "qwen", 1200.0, "US-KS-2", True)
        assert volume.storage_usd_per_gb_month == Decimal("0.05")  # RunPod's rate over 1 TB
        mount = VolumeMount(volume_id, "/workspace/models", data_center_id="US-KS-2")
        pod_id = client.rent(RentRequest(offer_id="NVIDIA H200:SECURE:1", image=IMAGE, disk_gb=50, label="vol-run",
                                         env={}, volume=mount))
        try:
            client.rent(RentRequest(offer_id="NVIDIA H200:COMMUNITY:1", image=IMAGE, disk_gb=50, label="community",
                                    env={}, volume=mount))
            raise AssertionError("a network volume was sent to Community Cloud")
        except OfferUnavailable as exc:
            assert "Secure Cloud" in str(exc)
    finally:
        client.close()
    sent = runpod_fake.deploy_inputs[-1]
    assert (sent["networkVolumeId"], sent["volumeMountPath"], sent["dataCenterId"]) == (
        volume_id, "/workspace/models", "US-KS-2")
    pod = runpod_sdk.value("get_pod", pod_id=pod_id)
    assert pod["volumeMountPath"] == "/workspace/models"
    assert runpod_fake.pods[pod_id].data_center_id == "US-KS-2"
    assert runpod_fake.pods[pod_id].network_volume["id"] == volume_id


def test_it_keeps_the_volume_mount_path_and_ports_a_pod_was_made_with(runpod_sdk):
    with_volume = runpod_sdk.value("create_pod", name="vol", image_name=IMAGE, gpu_type_id="NVIDIA H200",
                                   volume_in_gb=40, volume_mount_path="/data", ports="8888/http, 22/tcp")["id"]
    bare = runpod_sdk.value("create_pod", name="bare", image_name=IMAGE, gpu_type_id="NVIDIA H200")["id"]
    first, second, listing = runpod_sdk.calls([("get_pod", {"pod_id": with_volume}), ("get_pod", {"pod_id": bare}),
                                               ("get_pods", {})])
    assert (first["value"]["volumeInGb"], first["value"]["volumeMountPath"]) == (40, "/data")
    assert first["value"]["ports"] == "8888/http,22/tcp"  # the SDK sent it without spaces
    # No ports asked: null, not the string "None"; the mount path is the SDK's own default, as sent.
    assert (second["value"]["volumeInGb"], second["value"]["volumeMountPath"], second["value"]["ports"]) == (
        0, "/runpod-volume", None)
    assert {p["id"]: p["volumeInGb"] for p in listing["value"]} == {with_volume: 40, bare: 0}


def test_the_sdks_pods_are_billed_to_the_product_per_pod(runpod_sdk, runpod_fake):
    """A pod made with the SDK, run and terminated, is still in the per-pod billing the product reconciles from."""
    pod_id = runpod_sdk.value("create_pod", name="billed", image_name=IMAGE, gpu_type_id="NVIDIA H200",
                              cloud_type="SECURE", container_disk_in_gb=20, volume_in_gb=50)["id"]
    runpod_fake.advance()
    runpod_fake.elapse(2)
    runpod_sdk.value("stop_pod", pod_id=pod_id)
    runpod_fake.elapse(10)  # stopped: only its volume bills, at RunPod's idle-volume rate
    runpod_sdk.value("terminate_pod", pod_id=pod_id)
    client = RunPodClient(runpod_fake.base_url, RUNPOD_KEY, max_retries=1, timeout_s=5)
    try:
        lines = {line.kind: line.amount_usd for line in client.charges() if line.instance_id == pod_id}
    finally:
        client.close()
    assert lines["gpu"] == Decimal("7.98")  # 2 h at $3.99, none while stopped
    running_disk = 70 * 0.10 / 730 * 2
    stopped_volume = 50 * 0.20 / 730 * 10
    assert lines["disk"] == Decimal(str(round(running_disk + stopped_volume, 6)))


def test_a_pod_the_sdk_stopped_bills_only_its_volume_in_the_products_live_cost(runpod_sdk, runpod_fake):
    pod_id = runpod_sdk.value("create_pod", name="idle", image_name=IMAGE, gpu_type_id="NVIDIA H200",
                              cloud_type="SECURE", volume_in_gb=73)["id"]
    runpod_fake.advance()
    client = RunPodClient(runpod_fake.base_url, RUNPOD_KEY, max_retries=1, timeout_s=5)
    try:
        assert client.get_instance(pod_id).billing_usd_per_hour is None  # running: its price, costPerHr
        runpod_sdk.value("stop_pod", pod_id=pod_id)
        stopped = client.get_instance(pod_id)
    finally:
        client.close()
    assert stopped.billing_usd_per_hour == Decimal("0.020000")  # 73 GB at $0.20/GB-month over 730 h
