{{/* Names, labels, URLs and the checks on value combinations the schema cannot express. */}}

{{- define "stasis.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The orchestrator's Service is named this, so users port-forward svc/<fullname>. */}}
{{- define "stasis.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Component names leave room for their suffix within the 63-character DNS label limit. */}}
{{- define "stasis.agentName" -}}
{{- printf "%s-agent" (include "stasis.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "stasis.referenceModelName" -}}
{{- printf "%s-reference-model" (include "stasis.fullname" . | trunc 47 | trimSuffix "-") }}
{{- end }}

{{- define "stasis.configName" -}}
{{- printf "%s-config" (include "stasis.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{- define "stasis.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "stasis.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stasis.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "stasis.labels" -}}
helm.sh/chart: {{ include "stasis.chart" . }}
{{ include "stasis.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stasis
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod template labels leave out the chart and app versions: a chart bump alone must not
roll the agents, since every replaced agent drains its node. */}}
{{- define "stasis.podLabels" -}}
{{ include "stasis.selectorLabels" . }}
app.kubernetes.io/part-of: stasis
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Namespace, labels and annotations of an object. Call with a dict: ctx (the root context),
component, and optionally annotations (merged over commonAnnotations) and clusterScoped. */}}
{{- define "stasis.metadata" -}}
{{- if not .clusterScoped -}}
namespace: {{ .ctx.Release.Namespace }}
{{ end -}}
labels:
  {{- include "stasis.labels" .ctx | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
{{- $annotations := merge (deepCopy (.annotations | default dict)) .ctx.Values.commonAnnotations }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Cluster-scoped names carry the namespace: one release name may be used in two namespaces. */}}
{{- define "stasis.clusterRoleName" -}}
{{- printf "%s-%s-nodes" .Release.Namespace (include "stasis.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* A component's image: its own repository (and digest) when it names one, else the chart's
image; the tag is the chart's in both cases. Called with (dict "ctx" $ "own" .Values.X.image),
or (dict "ctx" $) for the chart's image itself. */}}
{{- define "stasis.image" -}}
{{- $v := .ctx.Values.image }}
{{- $repository := $v.repository }}
{{- $digest := $v.digest }}
{{- $own := .own | default dict }}
{{- if $own.repository }}
{{- $repository = $own.repository }}
{{- $digest = $own.digest }}
{{- end }}
{{- if $digest }}
{{- printf "%s@%s" $repository $digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .ctx.Chart.AppVersion $v.tag) }}
{{- end }}
{{- end }}

{{- define "stasis.orchestratorServiceAccountName" -}}
{{- if .Values.orchestrator.serviceAccount.create }}
{{- default (include "stasis.fullname" .) .Values.orchestrator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.orchestrator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "stasis.agentServiceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "stasis.agentName" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The orchestrator Service's in-cluster DNS name. Agents use hostNetwork with
ClusterFirstWithHostNet DNS, so <service>.<namespace>.svc resolves through the search path. */}}
{{- define "stasis.orchestratorHost" -}}
{{- printf "%s.%s.svc" (include "stasis.fullname" .) .Release.Namespace }}
{{- end }}

{{- define "stasis.orchestratorAddr" -}}
{{- printf "%s:%d" (include "stasis.orchestratorHost" .) (int .Values.orchestrator.grpcPort) }}
{{- end }}

{{- define "stasis.clusterAddr" -}}
{{- printf "%s:%d" (include "stasis.orchestratorHost" .) (int .Values.orchestrator.clusterPort) }}
{{- end }}

{{- define "stasis.caSecretName" -}}
{{- default (printf "%s-ca" (include "stasis.fullname" .)) .Values.auth.caSecret }}
{{- end }}

{{- define "stasis.tokensSecretName" -}}
{{- default (printf "%s-tokens" (include "stasis.fullname" .)) .Values.auth.tokensSecret }}
{{- end }}

{{/* The names the orchestrator's certificate carries: its Service, however it is reached. */}}
{{- define "stasis.orchestratorHosts" -}}
{{- $svc := include "stasis.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- printf "%s,%s.%s,%s.%s.svc,%s.%s.svc.cluster.local,localhost,127.0.0.1" $svc $svc $ns $svc $ns $svc $ns }}
{{- end }}

{{- define "stasis.gatewayAddr" -}}
{{- printf "%s:%d" (include "stasis.orchestratorHost" .) (int .Values.gateway.port) }}
{{- end }}

{{- define "stasis.snapshotMountPath" -}}
/var/lib/stasis/snapshots
{{- end }}

{{- define "stasis.snapshotClaimName" -}}
{{- default (printf "%s-snapshots" (include "stasis.fullname" . | trunc 53 | trimSuffix "-")) .Values.snapshotStore.local.existingClaim }}
{{- end }}

{{- define "stasis.stateClaimName" -}}
{{- default (printf "%s-state" (include "stasis.fullname" . | trunc 57 | trimSuffix "-")) .Values.orchestrator.persistence.existingClaim }}
{{- end }}

{{/* The snapshot store URL both components pass as --snapshot-store (see snapshots.StoreSettings.url). */}}
{{- define "stasis.snapshotStoreURL" -}}
{{- $store := .Values.snapshotStore }}
{{- if eq $store.type "s3" }}
{{- $url := printf "s3://%s" $store.s3.bucket }}
{{- with trimAll "/" $store.s3.prefix }}
{{- $url = printf "%s/%s" $url . }}
{{- end }}
{{- $query := list }}
{{- with $store.s3.endpoint }}
{{- $query = append $query (printf "endpoint=%s" .) }}
{{- end }}
{{- with $store.s3.region }}
{{- $query = append $query (printf "region=%s" .) }}
{{- end }}
{{- if $query }}
{{- $url = printf "%s?%s" $url (join "&" $query) }}
{{- end }}
{{- $url }}
{{- else }}
{{- printf "file://%s" (include "stasis.snapshotMountPath" .) }}
{{- end }}
{{- end }}

{{- define "stasis.upstreamURL" -}}
{{- if .Values.referenceModel.enabled }}
{{- printf "http://%s.%s.svc:%d" (include "stasis.referenceModelName" .) .Release.Namespace (int .Values.referenceModel.port) }}
{{- else }}
{{- .Values.upstream.url }}
{{- end }}
{{- end }}

{{/* The gateway's renderer: the value, or qwen3 for the built-in reference model. */}}
{{- define "stasis.renderer" -}}
{{- if .Values.upstream.renderer }}{{ .Values.upstream.renderer }}{{ else if .Values.referenceModel.enabled }}qwen3{{ end }}
{{- end }}

{{/* Its tokenizer directory: the value, the mounted volume, or the reference model's. */}}
{{- define "stasis.tokenizer" -}}
{{- if .Values.upstream.tokenizer }}{{ .Values.upstream.tokenizer }}
{{- else if .Values.upstream.tokenizerVolume }}/etc/stasis/tokenizer
{{- else if .Values.referenceModel.enabled }}reference
{{- end }}
{{- end }}

{{/* S3 credentials from an existing Secret, for the orchestrator and the agents alike. */}}
{{- define "stasis.snapshotStoreEnv" -}}
{{- if and (eq .Values.snapshotStore.type "s3") .Values.snapshotStore.s3.credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.snapshotStore.s3.credentialsSecret }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.snapshotStore.s3.credentialsSecret }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- end }}

{{- define "stasis.snapshotStoreVolumeMount" -}}
{{- if eq .Values.snapshotStore.type "local" }}
- name: snapshots
  mountPath: {{ include "stasis.snapshotMountPath" . }}
{{- end }}
{{- end }}

{{- define "stasis.snapshotStoreVolume" -}}
{{- if eq .Values.snapshotStore.type "local" }}
- name: snapshots
  persistentVolumeClaim:
    claimName: {{ include "stasis.snapshotClaimName" . }}
{{- end }}
{{- end }}

{{/* Checks across values that values.schema.json cannot express, or that must hold even when
the schema is skipped (--skip-schema-validation). Each message names the value to set. */}}
{{- define "stasis.validate" -}}
{{- $store := .Values.snapshotStore }}
{{- if and (eq $store.type "s3") (not $store.s3.bucket) }}
{{- fail "snapshotStore.s3.bucket is required when snapshotStore.type=s3" }}
{{- end }}
{{- if not (has $store.type (list "local" "s3")) }}
{{- fail (printf "snapshotStore.type must be local or s3, got %q" $store.type) }}
{{- end }}
{{- if and (not .Values.referenceModel.enabled) (not .Values.upstream.url) }}
{{- fail "upstream.url is required (the OpenAI-compatible model server the gateway forwards to), unless referenceModel.enabled=true" }}
{{- end }}
{{- if and .Values.referenceModel.enabled .Values.upstream.url }}
{{- fail "set either upstream.url or referenceModel.enabled=true, not both: the gateway has one upstream" }}
{{- end }}
{{- if eq (int .Values.orchestrator.grpcPort) (int .Values.gateway.port) }}
{{- fail "orchestrator.grpcPort and gateway.port must differ" }}
{{- end }}
{{- if and .Values.auth.enabled (has (int .Values.orchestrator.clusterPort) (list (int .Values.orchestrator.grpcPort) (int .Values.gateway.port))) }}
{{- fail "orchestrator.clusterPort must differ from orchestrator.grpcPort and gateway.port" }}
{{- end }}
{{- if has (int .Values.orchestrator.healthPort) (list (int .Values.orchestrator.grpcPort) (int .Values.orchestrator.clusterPort) (int .Values.gateway.port)) }}
{{- fail "orchestrator.healthPort must differ from orchestrator.grpcPort, orchestrator.clusterPort and gateway.port" }}
{{- end }}
{{- if and (gt (int .Values.orchestrator.replicas) 1) (not .Values.database.urlSecret) }}
{{- fail "orchestrator.replicas > 1 needs database.urlSecret: replicas share their state in PostgreSQL (SQLite has one writer)" }}
{{- end }}
{{- end }}

{{/* A probe of a gRPC port: gRPC health checking when it is plaintext, a TCP connect when it
serves TLS (the kubelet's gRPC probe speaks no TLS). Takes (dict "auth" bool "port" int). */}}
{{- define "stasis.probe" -}}
{{- if .auth }}
tcpSocket:
  port: {{ .port }}
{{- else }}
grpc:
  port: {{ .port }}
{{- end }}
{{- end }}
