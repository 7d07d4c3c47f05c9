{{/* Chart name, or nameOverride. */}}
{{- define "kubedevice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Base name of every object: fullnameOverride, else the release name (plus the chart
name when the release name does not contain it). Components append -nvidia etc. */}}
{{- define "kubedevice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of a component's objects: (dict "root" $ "component" "generic"|"nvidia") */}}
{{- define "kubedevice.componentName" -}}
{{- $base := include "kubedevice.fullname" .root -}}
{{- if eq .component "generic" -}}{{ $base }}{{- else -}}{{ printf "%s-%s" $base .component }}{{- end -}}
{{- end -}}

{{- define "kubedevice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubedevice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kubedevice.labels" -}}
{{ include "kubedevice.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: kubedevice
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kubedevice.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* A component's config file text: values may hold YAML (a map) or, from
--set-file, the file's text (a string, used as it is). */}}
{{- define "kubedevice.configText" -}}
{{- if kindIs "string" . -}}{{ . }}{{- else -}}{{ toYaml . }}{{- end -}}
{{- end -}}

{{/* Pod template fields both components share. */}}
{{- define "kubedevice.podCommon" -}}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
