{{/* Labels of every object of component .name (a dict: root, name). */}}
{{- define "gkm.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: gkm
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- end }}

{{/* The selector labels of component .name: never change after install. */}}
{{- define "gkm.selector" -}}
app.kubernetes.io/name: {{ .name }}
{{- end }}

{{/* The image reference of a component (a dict: root, image). */}}
{{- define "gkm.image" -}}
{{- $registry := .root.Values.image.registry -}}
{{- if .image.digest -}}
{{ $registry }}/{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ $registry }}/{{ .image.repository }}:{{ .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The --log-json flag where logs are JSON. */}}
{{- define "gkm.logArgs" -}}
{{- if eq .Values.logFormat "json" }}
- --log-json
{{- end }}
{{- end }}

{{/* Pull secrets, where there are any. */}}
{{- define "gkm.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* nodeSelector, tolerations and affinity of a component's values. */}}
{{- define "gkm.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A hash of the operator's signature configuration: a change rolls its pods. */}}
{{- define "gkm.signatureChecksum" -}}
{{- toJson .Values.signature | sha256sum }}
{{- end }}

{{/*
The registry host files (registry.mirrors or registry.configPath) as a
volume named registry-hosts, laid out as <registry>/hosts.toml; empty when
neither is set. `hostPath` allows the node directory (the agent only).
*/}}
{{- define "gkm.registryHostsVolume" -}}
{{- $registry := .root.Values.registry -}}
{{- if and $registry.mirrors $registry.configPath -}}
{{- fail "registry.mirrors and registry.configPath: set one of them" -}}
{{- end -}}
{{- if $registry.mirrors }}
- name: registry-hosts
  configMap:
    name: gkm-registry-hosts
    items:
      {{- range $host, $_ := $registry.mirrors }}
      - key: {{ include "gkm.registryHostsKey" $host }}
        path: {{ $host }}/hosts.toml
      {{- end }}
{{- else if and $registry.configPath .hostPath }}
- name: registry-hosts
  hostPath:
    path: {{ $registry.configPath }}
    type: Directory
{{- end }}
{{- end }}

{{/* The ConfigMap key of a registry's hosts.toml (keys cannot hold ':'). */}}
{{- define "gkm.registryHostsKey" -}}
{{ regexReplaceAll "[^-._a-zA-Z0-9]" . "_" }}.toml
{{- end }}
