{{/*
Names and labels, following the prometheus-community charts.
*/}}

{{/* Chart name, overridable with nameOverride. */}}
{{- define "esp-retrieval.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: release-chart, or the release name alone when it already contains the
chart name. Truncated to 63 characters (DNS label limit).
*/}}
{{- define "esp-retrieval.fullname" -}}
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

{{/* chart label value: name-version. */}}
{{- define "esp-retrieval.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the pods; never change them (Deployment selectors are immutable). */}}
{{- define "esp-retrieval.selectorLabels" -}}
app.kubernetes.io/name: {{ include "esp-retrieval.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "esp-retrieval.labels" -}}
helm.sh/chart: {{ include "esp-retrieval.chart" . }}
{{ include "esp-retrieval.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: esp-retrieval
{{- end }}

{{/* ServiceAccount name. */}}
{{- define "esp-retrieval.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "esp-retrieval.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference: image.tag, else appVersion (+ the CUDA suffix on GPU pods). */}}
{{- define "esp-retrieval.image" -}}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $tag = .Chart.AppVersion }}
{{- if .Values.gpu.enabled }}
{{- $tag = printf "%s%s" $tag .Values.gpu.imageTagSuffix }}
{{- end }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* Name of the Secret with the admin token ("" when admin routes are off). */}}
{{- define "esp-retrieval.adminSecretName" -}}
{{- if .Values.adminToken.existingSecret }}
{{- .Values.adminToken.existingSecret }}
{{- else if .Values.adminToken.value }}
{{- printf "%s-admin" (include "esp-retrieval.fullname" .) }}
{{- end }}
{{- end }}

{{/* Path of the registry file inside the container. */}}
{{- define "esp-retrieval.registryPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.registry.mountPath) .Values.registry.fileName }}
{{- end }}

{{/* Container resources, with the GPU limit added on GPU pods. */}}
{{- define "esp-retrieval.resources" -}}
{{- $resources := deepCopy .Values.resources }}
{{- if .Values.gpu.enabled }}
{{- $limits := deepCopy (default (dict) (get $resources "limits")) }}
{{- $_ := set $limits .Values.gpu.resourceName .Values.gpu.count }}
{{- $_ = set $resources "limits" $limits }}
{{- end }}
{{- if $resources }}
{{- toYaml $resources }}
{{- end }}
{{- end }}

{{/* The bundle the server loads at start (--bundle, ESP_BUNDLE): the image's folder, a folder of
the claim, the fetched copy in the cache (initContainer) or the URI itself (inProcess). */}}
{{- define "esp-retrieval.bundleRef" -}}
{{- $b := .Values.bundle }}
{{- if eq $b.source "pvc" }}
{{- $root := trimSuffix "/" $b.pvc.mountPath }}
{{- if $b.pvc.subPath }}{{ printf "%s/%s" $root (trimPrefix "/" $b.pvc.subPath) }}{{ else }}{{ $root }}{{ end }}
{{- else if eq $b.source "remote" }}
{{- if eq $b.remote.fetch "initContainer" }}{{ printf "%s/%s" (trimSuffix "/" $b.remote.cache.mountPath) $b.remote.sha256 }}{{ else }}{{ $b.remote.uri }}{{ end }}
{{- else }}
{{- $b.path }}
{{- end }}
{{- end }}
