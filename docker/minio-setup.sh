#!/bin/sh
# One-shot, run by compose's minio-setup service with MinIO's root key: makes the checkpoint bucket, and a user with
# the product's key (S3_ACCESS_KEY / S3_SECRET_KEY) whose policy (docker/minio-policy.json) reaches that bucket only.
# The web app, the workers and the presigned URLs they hand to boxes use that user, never the root key.
# Safe to run again: the bucket and policy are kept or replaced, the user's secret is set again.
set -eu

case "$S3_BUCKET" in
  *[!a-z0-9.-]* | "" ) echo "minio-setup: S3_BUCKET=$S3_BUCKET is not a bucket name (a-z, 0-9, '.', '-')" >&2; exit 1 ;;
esac
if [ "$S3_ACCESS_KEY" = "$MINIO_ROOT_USER" ]; then
  echo "minio-setup: S3_ACCESS_KEY must not be MinIO's root user" >&2
  exit 1
fi

mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing "local/$S3_BUCKET"
sed "s/BUCKET/$S3_BUCKET/g" /etc/minio-setup/policy.json > /tmp/fleet-bucket-policy.json
mc admin policy create local fleet-bucket /tmp/fleet-bucket-policy.json
mc admin user add local "$S3_ACCESS_KEY" "$S3_SECRET_KEY"
# attach answers an error when the policy is attached already: that is the state wanted
mc admin policy attach local fleet-bucket --user "$S3_ACCESS_KEY" \
  || mc admin user info local "$S3_ACCESS_KEY" | grep -q "fleet-bucket"
echo "minio-setup: user $S3_ACCESS_KEY may use s3://$S3_BUCKET only"
